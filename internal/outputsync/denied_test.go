package outputsync

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// accessDenied is the error the SDK returns for S3's 403 AccessDenied.
func accessDenied() error {
	return &smithyhttp.ResponseError{
		Response: &smithyhttp.Response{Response: &http.Response{StatusCode: http.StatusForbidden}},
		Err:      &smithy.GenericAPIError{Code: "AccessDenied", Message: "Access Denied"},
	}
}

// deniedS3 plays S3 under an IAM policy (fault injection over versitygw,
// which enforces none): without s3:ListBucket on the bucket, S3 answers a
// GetObject of a missing key with 403 instead of 404; denyList refuses
// listings too; denyGet refuses every GetObject of the manifest.
type deniedS3 struct {
	*countingS3
	manifest          string // the thread's manifest key (denyGet)
	denyList, denyGet bool
}

func (d *deniedS3) GetObject(ctx context.Context, in *s3.GetObjectInput, o ...func(*s3.Options)) (*s3.GetObjectOutput, error) {
	if d.denyGet && aws.ToString(in.Key) == d.manifest {
		return nil, accessDenied()
	}
	out, err := d.countingS3.GetObject(ctx, in, o...)
	if err != nil && isNotFound(err) {
		return nil, accessDenied()
	}
	return out, err
}

func (d *deniedS3) ListObjectsV2(ctx context.Context, in *s3.ListObjectsV2Input, o ...func(*s3.Options)) (*s3.ListObjectsV2Output, error) {
	if d.denyList {
		return nil, accessDenied()
	}
	return d.countingS3.ListObjectsV2(ctx, in, o...)
}

// TestManifestReadForbidden: a 403 on the manifest is "no manifest yet"
// only when a listing confirms the key is absent (the first sync of a
// thread then uploads everything); when the listing is refused, or shows
// the manifest exists, the pass fails instead of starting over.
func TestManifestReadForbidden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name              string
		existing          bool // a first pass stored a manifest
		denyList, denyGet bool
		wantErr           bool
	}{
		{"missing, listing confirms", false, false, false, false},
		{"missing, listing refused", false, true, false, true},
		{"present but unreadable", true, false, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newSyncEnv(t)
			writeFile(t, e.sb.home, "outputs/report.md", []byte("# report"), t0)
			if tt.existing {
				e.mustSync(e.syncer(Options{}), "sb1")
				writeFile(t, e.sb.home, "outputs/more.md", []byte("more"), t0)
			}
			s, err := New(e.sb, &deniedS3{countingS3: e.s3, manifest: manifestKey(testPrefix, e.key), denyList: tt.denyList, denyGet: tt.denyGet},
				Options{Bucket: e.bucket, Prefix: testPrefix, Home: e.sb.home})
			if err != nil {
				t.Fatal(err)
			}
			res, err := e.sync(s, "sb1")
			if tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), "manifest") {
					t.Fatalf("Sync = %+v, %v; want a manifest error", res, err)
				}
				return
			}
			if err != nil || res.Uploaded != 1 || !res.Complete {
				t.Fatalf("Sync = %+v, %v; want the file uploaded, complete", res, err)
			}
			if _, ok := e.object("outputs/report.md"); !ok {
				t.Error("object not in S3")
			}
		})
	}
}
