package devstack

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

var tokenTenant = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// TenantToken is one tenant:token pair of BROKER_DEV_TOKENS.
type TenantToken struct {
	Tenant string
	Token  string
}

// TokenList is tenant -> token in a fixed order; it is written to JSON as
// an object whose keys keep that order (encoding/json sorts map keys).
type TokenList []TenantToken

// MarshalJSON writes {"tenant":"token",...} in list order.
func (l TokenList) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, t := range l {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(t.Tenant)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(t.Token)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

// UnmarshalJSON reads an object of tenant -> token keeping its key order.
func (l *TokenList) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		*l = nil
		return nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return errors.New("tokens: want an object of tenant to token")
	}
	out := TokenList{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return err
		}
		var v string
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("tokens: tenant %v: %w", k, err)
		}
		out = append(out, TenantToken{Tenant: k.(string), Token: v})
	}
	*l = out
	return nil
}

// Get returns the token of tenant.
func (l TokenList) Get(tenant string) (string, bool) {
	for _, t := range l {
		if t.Tenant == tenant {
			return t.Token, true
		}
	}
	return "", false
}

// ParseTokens parses "tenant:token,tenant2:token2" into token -> tenant.
// Tenants must match ^[A-Za-z0-9_-]{1,64}$; tokens must be non-empty,
// without spaces, and unique.
func ParseTokens(s string) (map[string]string, error) {
	list, err := ParseTokenList(s)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(list))
	for _, t := range list {
		out[t.Token] = t.Tenant
	}
	return out, nil
}

// ParseTokenList parses "tenant:token,tenant2:token2" keeping the order
// given, with the rules of ParseTokens. A tenant may appear more than once
// (several tokens); Tenants lists each once.
func ParseTokenList(s string) ([]TenantToken, error) {
	var out []TenantToken
	seen := map[string]bool{}
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		tenant, token, ok := strings.Cut(pair, ":")
		if !ok || !tokenTenant.MatchString(tenant) || token == "" || strings.ContainsAny(token, " \t") {
			return nil, fmt.Errorf("BROKER_DEV_TOKENS: %q is not tenant:token (tenant ^[A-Za-z0-9_-]{1,64}$, token without spaces)", pair)
		}
		if seen[token] {
			return nil, fmt.Errorf("BROKER_DEV_TOKENS: token of tenant %s is used twice", tenant)
		}
		seen[token] = true
		out = append(out, TenantToken{Tenant: tenant, Token: token})
	}
	if len(out) == 0 {
		return nil, errors.New("BROKER_DEV_TOKENS: no tenant:token pair")
	}
	return out, nil
}

// Tenants returns the tenants of list in order, each once.
func Tenants(list []TenantToken) []string {
	var out []string
	seen := map[string]bool{}
	for _, t := range list {
		if !seen[t.Tenant] {
			seen[t.Tenant] = true
			out = append(out, t.Tenant)
		}
	}
	return out
}

// orderTokens turns token -> tenant into one token per tenant (the
// smallest, when a tenant has several), tenants in order first, then the
// rest sorted.
func orderTokens(tokens map[string]string, order []string) TokenList {
	byTenant := map[string]string{}
	for token, tenant := range tokens {
		if prev, ok := byTenant[tenant]; !ok || token < prev {
			byTenant[tenant] = token
		}
	}
	var out TokenList
	for _, tenant := range order {
		if tok, ok := byTenant[tenant]; ok {
			out = append(out, TenantToken{Tenant: tenant, Token: tok})
			delete(byTenant, tenant)
		}
	}
	rest := make([]string, 0, len(byTenant))
	for tenant := range byTenant {
		rest = append(rest, tenant)
	}
	sort.Strings(rest)
	for _, tenant := range rest {
		out = append(out, TenantToken{Tenant: tenant, Token: byTenant[tenant]})
	}
	return out
}

func randomBase64(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
