package providerfile

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var update = flag.Bool("update", false, "rewrite the golden error messages")

func ptr[T any](v T) *T { return &v }

func TestLoadExample(t *testing.T) {
	f, err := Load("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := &File{
		Routing: Ordered,
		Providers: []Provider{
			{Name: "openai", Kind: KindOpenAI, Model: "gpt-4o-mini", APIKeyEnv: "OPENAI_API_KEY", RPM: 5000, TPM: 2_000_000,
				Concurrency: 32, Timeout: 30 * time.Second, Weight: ptr(1),
				Price: Price{InputPerMTok: 0.15, OutputPerMTok: 0.60, CachedInputPerMTok: 0.075}, line: 4},
			{Name: "local", Kind: KindOpenAI, BaseURL: "http://127.0.0.1:8000/v1", Model: "qwen2.5-7b-instruct", APIKeyEnv: "OPENAI_API_KEY",
				Concurrency: 4, Timeout: 2 * time.Minute, Weight: ptr(1), line: 13},
			{Name: "bedrock", Kind: KindBedrock, Model: "anthropic.claude-3-haiku-20240307-v1:0", Region: "us-east-1", RPM: 1000,
				Concurrency: DefaultConcurrency, Timeout: DefaultTimeout, Weight: ptr(0), Price: Price{InputPerMTok: 0.25, OutputPerMTok: 1.25}, line: 19},
		},
		name: "testdata/example.yaml",
	}
	if diff := cmp.Diff(want, f, cmp.AllowUnexported(File{}, Provider{})); diff != "" {
		t.Errorf("Load (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"openai", "local", "bedrock"}, f.Names()); diff != "" {
		t.Errorf("Names (-want +got):\n%s", diff)
	}
}

// TestDefaults: the smallest file gets every default in one place.
func TestDefaults(t *testing.T) {
	f, err := Parse("p.yaml", []byte("providers:\n  - {name: s, kind: sim}\n  - {name: m, kind: mock, base_url: 'http://127.0.0.1:1/v1'}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Provider{
		{Name: "s", Kind: KindSim, Model: "sim-1", Concurrency: 8, Timeout: time.Minute, Weight: ptr(1)},
		{Name: "m", Kind: KindMock, BaseURL: "http://127.0.0.1:1/v1", Model: "mock-1", Concurrency: 8, Timeout: time.Minute, Weight: ptr(1)},
	}
	if diff := cmp.Diff(want, f.Providers, cmpopts.IgnoreUnexported(Provider{})); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if f.Routing != Ordered {
		t.Errorf("routing = %q, want ordered", f.Routing)
	}
}

// TestBadFilesGolden holds every rejected file's message against a golden
// file: the messages are the interface a user sees.
func TestBadFilesGolden(t *testing.T) {
	paths, err := filepath.Glob("testdata/bad/*.yaml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no bad files: %v", err)
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			_, err := Load(p)
			if err == nil {
				t.Fatal("accepted")
			}
			golden := strings.TrimSuffix(p, ".yaml") + ".golden"
			got := err.Error() + "\n"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("message (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Errorf("err = %v, want one naming the file", err)
	}
}

// FuzzParse: any input is either a valid file or an error naming the file;
// never a panic, and a valid file passes Validate again unchanged.
func FuzzParse(f *testing.F) {
	paths, _ := filepath.Glob("testdata/bad/*.yaml")
	paths = append(paths, "testdata/example.yaml")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		pf, err := Parse("fuzz.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if len(pf.Providers) == 0 {
			t.Fatal("accepted a file without providers")
		}
		if err := pf.Validate(); err != nil {
			t.Fatalf("valid file fails Validate again: %v", err)
		}
		for _, p := range pf.Providers {
			if p.Concurrency < 1 || p.Timeout <= 0 || p.Weight == nil || *p.Weight < 0 {
				t.Fatalf("accepted provider without defaults applied: %+v", p)
			}
		}
	})
}

// TestReadmeExamples: the README's providers files parse and validate.
func TestReadmeExamples(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(# providers[^\n]*\n.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) < 2 {
		t.Fatalf("found %d providers files in README.md, want the two examples", len(blocks))
	}
	for _, b := range blocks {
		f, err := Parse("README.md", []byte(b[1]))
		if err != nil {
			t.Errorf("README example does not parse: %v\n%s", err, b[1])
			continue
		}
		if len(f.Providers) < 2 {
			t.Errorf("README example has %d providers, want several", len(f.Providers))
		}
	}
}

// TestAPIKeyParam: an entry that names its key's SSM parameter gets no
// default api_key_env, so the two never both apply.
func TestAPIKeyParam(t *testing.T) {
	f, err := Parse("p.yaml", []byte("providers:\n  - {name: o, kind: openai, api_key_param: /batchgen/openai-key}\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := f.Providers[0]
	if got.APIKeyParam != "/batchgen/openai-key" || got.APIKeyEnv != "" {
		t.Errorf("api_key_param %q, api_key_env %q; want the parameter and no variable", got.APIKeyParam, got.APIKeyEnv)
	}
}

// TestFixedModels: a task may choose its model under a lone provider, not
// under several (each calls its own entry's model), and the reason names
// the providers.
func TestFixedModels(t *testing.T) {
	one, err := Parse("one.yaml", []byte("providers:\n  - {name: s, kind: sim}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := one.FixedModels(); got != "" {
		t.Errorf("one provider: FixedModels = %q, want empty (the task's model is called)", got)
	}
	two, err := Parse("two.yaml", []byte("providers:\n  - {name: east, kind: sim}\n  - {name: west, kind: sim}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := two.FixedModels(); !strings.Contains(got, "east, west") {
		t.Errorf("two providers: FixedModels = %q, want the reason naming east, west", got)
	}
}
