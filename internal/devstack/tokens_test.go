package devstack

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestParseTokenListKeepsOrder(t *testing.T) {
	got, err := ParseTokenList("zeta:z-token, acme:a-token,zeta:z2,beta:b-token")
	if err != nil {
		t.Fatal(err)
	}
	want := []TenantToken{{"zeta", "z-token"}, {"acme", "a-token"}, {"zeta", "z2"}, {"beta", "b-token"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseTokenList = %v, want %v", got, want)
	}
	if got, want := Tenants(got), []string{"zeta", "acme", "beta"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Tenants = %v, want %v", got, want)
	}
}

func TestStackJSONKeepsTokenOrder(t *testing.T) {
	tests := []struct {
		name  string
		order []string
		want  string
	}{
		{name: "BROKER_DEV_TOKENS order", order: []string{"zeta", "acme", "beta"},
			want: `{"zeta":"z-token","acme":"a-token","beta":"b-token"}`},
		{name: "unlisted tenants follow sorted", order: []string{"zeta"},
			want: `{"zeta":"z-token","acme":"a-token","beta":"b-token"}`},
		{name: "no order: sorted", want: `{"acme":"a-token","beta":"b-token","zeta":"z-token"}`},
	}
	tokens := map[string]string{"z-token": "zeta", "zz-token": "zeta", "a-token": "acme", "b-token": "beta"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info := Info{Tokens: orderTokens(tokens, tt.order)}
			b, err := json.Marshal(info)
			if err != nil {
				t.Fatal(err)
			}
			var raw map[string]json.RawMessage
			if err := json.Unmarshal(b, &raw); err != nil {
				t.Fatal(err)
			}
			if got := string(raw["tokens"]); got != tt.want {
				t.Errorf("tokens = %s, want %s", got, tt.want)
			}
			var back Info
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back.Tokens, info.Tokens) {
				t.Errorf("round trip = %v, want %v", back.Tokens, info.Tokens)
			}
		})
	}
}

func TestMakeRunEnvDefaultsAdminToTheFirstTenant(t *testing.T) {
	tokens := []TenantToken{{"dev", "dev-token"}, {"acme", "acme-token"}}
	tests := []struct {
		name    string
		environ []string
		want    []string
		wantAdm []string
	}{
		{name: "default: first tenant", environ: []string{"SANDBOX_REPLICAS=1"},
			want: []string{"SANDBOX_REPLICAS=1", "BROKER_ADMIN_TENANTS=dev"}, wantAdm: []string{"dev"}},
		{name: "set: passed through", environ: []string{"BROKER_ADMIN_TENANTS=acme, ops"},
			want: []string{"BROKER_ADMIN_TENANTS=acme, ops"}, wantAdm: []string{"acme", "ops"}},
		{name: "set empty: no admin", environ: []string{"BROKER_ADMIN_TENANTS="},
			want: []string{"BROKER_ADMIN_TENANTS="}, wantAdm: []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := MakeRunEnv(tt.environ, tokens)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("MakeRunEnv = %v, want %v", got, tt.want)
			}
			if adm := adminTenants(got); !reflect.DeepEqual(adm, tt.wantAdm) {
				t.Errorf("adminTenants = %v, want %v", adm, tt.wantAdm)
			}
		})
	}
}

func TestBannerS3CommandNeedsNoAWSConfig(t *testing.T) {
	s := &Stack{StackFile: "/r/.run/stack.json", Info: Info{
		Tokens:       TokenList{{"zeta", "z-token"}, {"acme", "a-token"}},
		AdminTenants: []string{"zeta"},
		S3:           S3Info{Endpoint: "http://127.0.0.1:9000", Region: "us-east-1", AccessKey: "ak", SecretKey: "sk", Bucket: "bkt"},
	}}
	b := s.Banner(0)
	for _, want := range []string{
		"AWS_ACCESS_KEY_ID=ak AWS_SECRET_ACCESS_KEY=sk AWS_DEFAULT_REGION=us-east-1 aws --endpoint-url http://127.0.0.1:9000 s3 ls --recursive s3://bkt/",
		"token        zeta -> Authorization: Bearer z-token (sbx default, admin: may drain)\n  token        acme -> Authorization: Bearer a-token\n",
	} {
		if !strings.Contains(b, want) {
			t.Errorf("banner lacks %q:\n%s", want, b)
		}
	}
}
