package embedded

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
)

// WriteFileAtomic writes r to path through a temp file in the same
// directory and a rename, so a failed write never leaves a truncated
// workbook behind.
func WriteFileAtomic(path string, r io.Reader) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, r); err != nil {
		return err
	}
	// CreateTemp makes the file 0600; a result is an ordinary document.
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	ok = true
	return nil
}

// FileIdentity is the content hash of the input, so the same content run
// again continues the same task wherever the file lives.
func FileIdentity(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", UnwrapPathError(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
