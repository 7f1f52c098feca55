package stack

import (
	"strings"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
)

const testSecretKey = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"

// namedSecretSynth uses an existing secret given by name, encrypted with a
// customer managed key.
func namedSecretSynth(t *testing.T) *synthesized {
	p := DefaultProps()
	p.ExistingSecretARN = "e2b-key"
	p.ExistingSecretKMSKeyARN = testSecretKey
	return synth(t, "named-secret", p)
}

// TestSecretByName: an existing secret given by name reaches the functions
// as that name (GetSecretValue takes a name), their policies name every
// ARN Secrets Manager may have given it (name-??????), and they may decrypt
// with its customer managed key through Secrets Manager only.
func TestSecretByName(t *testing.T) {
	s := namedSecretSynth(t)
	if len(s.errors) != 0 {
		t.Errorf("cdk-nag errors: %s", strings.Join(s.errors, "\n"))
	}
	if n := len(s.Resources("AWS::SecretsManager::Secret")); n != 1 {
		t.Errorf("%d secrets created, want the webhook secret only", n)
	}
	wantRead := `{"Action":"secretsmanager:GetSecretValue","Effect":"Allow","Resource":{"Fn::Sub":"arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:e2b-key-??????"},"Sid":"ReadE2BApiKey"}`
	wantDecrypt := `{"Action":"kms:Decrypt","Condition":{"StringEquals":{"kms:ViaService":{"Fn::Sub":"secretsmanager.${AWS::Region}.amazonaws.com"}}},"Effect":"Allow","Resource":"` + testSecretKey + `","Sid":"DecryptE2BApiKey"}`
	for _, f := range Functions {
		env := props(s.Resources("AWS::Lambda::Function")[f.LogicalID])["Environment"].(map[string]any)["Variables"].(map[string]any)
		if env[config.EnvE2BAPIKeySecretARN] != "e2b-key" {
			t.Errorf("%s: %s = %v, want the name", f.Name, config.EnvE2BAPIKeySecretARN, env[config.EnvE2BAPIKeySecretARN])
		}
		bySid := map[string]string{}
		for _, st := range cdkStatements(t, s, f) {
			bySid[st["Sid"].(string)] = str(st)
		}
		if bySid["ReadE2BApiKey"] != wantRead || bySid["DecryptE2BApiKey"] != wantDecrypt {
			t.Errorf("%s: read %s\ndecrypt %s\nwant %s\nand %s", f.Name, bySid["ReadE2BApiKey"], bySid["DecryptE2BApiKey"], wantRead, wantDecrypt)
		}
	}
	// The default stack's own secret needs no key grant.
	for _, f := range Functions {
		for _, st := range cdkStatements(t, defaultSynth(t), f) {
			if st["Sid"] == "DecryptE2BApiKey" {
				t.Errorf("%s: default stack grants %s", f.Name, str(st))
			}
		}
	}
}

// TestSecretGrantARN: a complete ARN is named as it is; a partial ARN gets
// the wildcard for the suffix.
func TestSecretGrantARN(t *testing.T) {
	complete := "arn:aws:secretsmanager:eu-west-1:123456789012:secret:e2b-key-AbCdEf"
	if got := *secretGrantARN(complete); got != complete {
		t.Errorf("complete ARN: %s", got)
	}
	partial := "arn:aws:secretsmanager:eu-west-1:123456789012:secret:e2b-key"
	if got := *secretGrantARN(partial); got != partial+"-??????" {
		t.Errorf("partial ARN: %s", got)
	}
}
