package s3blob

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

func TestObjectKey(t *testing.T) {
	tests := []struct {
		name    string
		prefix  string
		key     string
		want    string
		wantErr bool
	}{
		{"plain", "", "results/t.xlsx", "results/t.xlsx", false},
		{"unicode and spaces", "", "incoming/a b/名.xlsx", "incoming/a b/名.xlsx", false},
		{"prefix", "tenant", "results/t.xlsx", "tenant/results/t.xlsx", false},
		{"prefix slashes trimmed", "/tenant/a/", "x", "tenant/a/x", false},
		{"empty", "", "", "", true},
		{"dot", "", ".", "", true},
		{"dotdot", "", "..", "", true},
		{"parent", "", "../x", "", true},
		{"inner parent", "", "a/../../x", "", true},
		{"absolute", "", "/etc/passwd", "", true},
		{"empty element", "", "a//b", "", true},
		{"trailing slash", "", "a/", "", true},
		{"backslash", "", `a\b`, "", true},
		{"NUL", "", "a\x00b", "", true},
		{"too long", "", strings.Repeat("k", 1025), "", true},
		{"too long with prefix", strings.Repeat("p", 24), strings.Repeat("k", 1000), "", true},
		{"bad prefix", "../up", "x", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A client that is never called: ObjectKey is pure.
			s := New(s3.New(s3.Options{Region: "us-east-1"}), "bucket", Options{Prefix: tt.prefix})
			got, err := s.ObjectKey(tt.key)
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidKey) {
					t.Fatalf("ObjectKey(%q) = %q, %v; want %v", tt.key, got, err, ErrInvalidKey)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ObjectKey(%q) = %q, %v; want %q", tt.key, got, err, tt.want)
			}
		})
	}
}

// apiErr is a service error with a code, as the SDK returns for
// unmodelled errors.
func apiErr(code string) error { return &smithy.GenericAPIError{Code: code, Message: code} }

// httpErr wraps err in a response error with status.
func httpErr(status int, err error) error {
	return &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}}, Err: err}
}

func TestIsNotFound(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"NoSuchKey", fmt.Errorf("get: %w", &types.NoSuchKey{}), true},
		{"NotFound from HeadObject", &types.NotFound{}, true},
		{"NoSuchKey code", apiErr("NoSuchKey"), true},
		{"bare 404", httpErr(http.StatusNotFound, errors.New("no body")), true},
		{"missing bucket", httpErr(http.StatusNotFound, apiErr("NoSuchBucket")), false},
		{"access denied", httpErr(http.StatusForbidden, apiErr("AccessDenied")), false},
		{"other", errors.New("connection reset"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := isNotFound(tt.err); got != tt.want {
				t.Errorf("isNotFound(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
