package samstack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sync"
)

// VenvEnv names the Python virtualenv that holds the SAM translator
// (infra/venv.sh creates it; default <repo>/.venv).
const VenvEnv = "BATCHGEN_VENV"

// translateScript is the SAM-to-CloudFormation translator, relative to the
// repository root; the same one infra/lint.sh lints the translation with.
const translateScript = "infra/sam_translate.py"

// definitionURI finds the local files a template's state machines load,
// which the translation inlines and so must key the cache.
var definitionURI = regexp.MustCompile(`(?m)^\s*DefinitionUri:\s*["']?([^\s"'#]+)`)

var translations struct {
	sync.Mutex
	byKey map[string][]byte
}

// Translate returns the plain CloudFormation that `sam deploy` would submit
// for the SAM template at path, as JSON: infra/sam_translate.py run by the
// project's virtualenv, the real SAM translator rather than a copy of its
// rules. Importing the translator takes seconds, so results are cached in
// the process and on disk, keyed by the template, the files it loads and
// the script.
func Translate(ctx context.Context, path string) ([]byte, error) {
	tpl, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read template: %w", err)
	}
	root, err := repoRoot(path)
	if err != nil {
		return nil, err
	}
	script := filepath.Join(root, translateScript)
	h := sha256.New()
	for _, f := range [][]byte{tpl, []byte(script)} {
		fmt.Fprintf(h, "%d:", len(f))
		h.Write(f)
	}
	src, err := os.ReadFile(script)
	if err != nil {
		return nil, fmt.Errorf("read the SAM translator: %w", err)
	}
	h.Write(src)
	for _, m := range definitionURI.FindAllSubmatch(tpl, -1) {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(path), string(m[1])))
		if err != nil {
			return nil, fmt.Errorf("DefinitionUri: %w", err)
		}
		fmt.Fprintf(h, "%s:%d:", m[1], len(b))
		h.Write(b)
	}
	key := hex.EncodeToString(h.Sum(nil))

	translations.Lock()
	defer translations.Unlock()
	if out, ok := translations.byKey[key]; ok {
		return out, nil
	}
	cache := filepath.Join(cacheDir(), "sam-"+key+".json")
	out, err := os.ReadFile(cache)
	if err != nil || !json.Valid(out) {
		if out, err = runTranslator(ctx, root, script, path); err != nil {
			return nil, err
		}
		if err := writeCache(cache, out); err != nil {
			return nil, err
		}
	}
	if translations.byKey == nil {
		translations.byKey = map[string][]byte{}
	}
	translations.byKey[key] = out
	return out, nil
}

func runTranslator(ctx context.Context, root, script, path string) ([]byte, error) {
	venv := os.Getenv(VenvEnv)
	if venv == "" {
		venv = filepath.Join(root, ".venv")
	}
	python := filepath.Join(venv, "bin", "python")
	if _, err := os.Stat(python); err != nil {
		return nil, fmt.Errorf("the SAM translator needs the project's Python virtualenv: %s not found (run infra/venv.sh, or set %s)", python, VenvEnv)
	}
	out, err := os.CreateTemp("", "sam-translation-*.json")
	if err != nil {
		return nil, fmt.Errorf("translate %s: %w", path, err)
	}
	_ = out.Close()
	defer os.Remove(out.Name())
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, python, script, path, out.Name())
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("translate %s with %s: %w: %s", path, translateScript, err, bytes.TrimSpace(stderr.Bytes()))
	}
	b, err := os.ReadFile(out.Name())
	if err != nil {
		return nil, fmt.Errorf("translate %s: %w", path, err)
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("translate %s: the translator wrote invalid JSON", path)
	}
	return b, nil
}

// repoRoot finds the repository that holds the translator: the template's
// own directory (a checkout's template.yaml), else the checkout the
// working directory is in (tests, which run in their package's directory,
// provision edited copies of the template from temporary directories),
// else the source tree this package was built from.
func repoRoot(templatePath string) (string, error) {
	var candidates []string
	if dir, err := filepath.Abs(filepath.Dir(templatePath)); err == nil {
		candidates = append(candidates, dir)
	}
	if wd, err := os.Getwd(); err == nil {
		for dir := wd; ; dir = filepath.Dir(dir) {
			candidates = append(candidates, dir)
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	// Without -trimpath, the path this file was compiled from.
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		candidates = append(candidates, filepath.Join(filepath.Dir(file), "..", ".."))
	}
	for _, dir := range candidates {
		if _, err := os.Stat(filepath.Join(dir, translateScript)); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("cannot find " + translateScript + " beside the template, above the working directory or in the source tree")
}

func cacheDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "batchgen")
	}
	return filepath.Join(os.TempDir(), "batchgen-cache")
}

// writeCache stores a translation atomically, so that parallel test
// processes never read half a file.
func writeCache(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("cache the translation: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".sam-*.json")
	if err != nil {
		return fmt.Errorf("cache the translation: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
		return fmt.Errorf("cache the translation: %w", err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("cache the translation: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("cache the translation: %w", err)
	}
	return nil
}
