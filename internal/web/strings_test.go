package web_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// parseStringTables reads strings.js's tables: each language opens with
// `  xx: {` and holds one `"key": "value",` per line.
func parseStringTables(t *testing.T, js string) map[string]map[string]string {
	t.Helper()
	open := regexp.MustCompile(`^  ([a-z]{2}): \{$`)
	entry := regexp.MustCompile(`^    ("(?:[^"\\]|\\.)*"): ("(?:[^"\\]|\\.)*"),?$`)
	tables := map[string]map[string]string{}
	var cur map[string]string
	for _, line := range strings.Split(js, "\n") {
		if m := open.FindStringSubmatch(line); m != nil {
			cur = map[string]string{}
			tables[m[1]] = cur
			continue
		}
		if cur == nil {
			continue
		}
		if m := entry.FindStringSubmatch(line); m != nil {
			var k, v string
			if err := json.Unmarshal([]byte(m[1]), &k); err != nil {
				t.Fatalf("strings.js key %s: %v", m[1], err)
			}
			if err := json.Unmarshal([]byte(m[2]), &v); err != nil {
				t.Fatalf("strings.js value of %s: %v", k, err)
			}
			cur[k] = v
		}
	}
	return tables
}

// i18nKeys returns the keys named by data-i18n attributes.
func i18nKeys(html string) []string {
	var keys []string
	for _, m := range regexp.MustCompile(`data-i18n(?:-placeholder)?="([^"]+)"`).FindAllStringSubmatch(html, -1) {
		keys = append(keys, m[1])
	}
	return keys
}
