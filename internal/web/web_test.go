package web_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/web"
)

// form builds a multipart body with the file (when name is not empty) and
// the text fields.
func form(t *testing.T, name string, content []byte, fields map[string]string) (*bytes.Buffer, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for k, v := range fields {
		if err := mw.WriteField(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if name != "" {
		fw, err := mw.CreateFormFile("file", name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fw.Write(content); err != nil {
			t.Fatal(err)
		}
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf, mw.FormDataContentType()
}

// workbook writes an xlsx with a data sheet and, when prompt is not empty,
// a "prompt" sheet holding it in A1.
func workbook(t *testing.T, rows [][]any, prompt string) []byte {
	t.Helper()
	f := excelize.NewFile()
	defer f.Close()
	if err := f.SetSheetName("Sheet1", "商品"); err != nil {
		t.Fatal(err)
	}
	for i, row := range rows {
		cell, _ := excelize.CoordinatesToCellName(1, i+1)
		if err := f.SetSheetRow("商品", cell, &row); err != nil {
			t.Fatal(err)
		}
	}
	if prompt != "" {
		if _, err := f.NewSheet("prompt"); err != nil {
			t.Fatal(err)
		}
		if err := f.SetCellValue("prompt", "A1", prompt); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if err := f.Write(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestInspect(t *testing.T) {
	t.Parallel()
	gbk := []byte{0xC9, 0xCC, 0xC6, 0xB7, ',', 'n', '\n', 0xB2, 0xE8, ',', '1', '\n'} // "商品,n\n茶,1\n" in GB18030
	xlsx := workbook(t, [][]any{{" 商品名称 ", "类目"}, {"绿茶", "饮料"}, {}, {"咖啡", "饮料"}, {"乌龙", "饮料"}, {"红茶", "饮料"}}, "为{{商品名称}}写文案")
	tests := []struct {
		name   string
		file   string
		body   []byte
		fields map[string]string
		want   web.Inspection
	}{
		{
			name: "csv", file: "skus.csv", body: []byte("sku,name\nA-1,Tea\nA-2,Coffee\n"),
			want: web.Inspection{Filename: "skus.csv", Encoding: "utf-8", Columns: []string{"sku", "name"}, Rows: 2, Sample: [][]string{{"A-1", "Tea"}, {"A-2", "Coffee"}}},
		},
		{
			name: "xlsx with a prompt sheet, blank rows skipped in the sample", file: "商品.xlsx", body: xlsx,
			want: web.Inspection{
				Filename: "商品.xlsx", Sheet: "商品", Columns: []string{"商品名称", "类目"}, Rows: 5,
				Sample: [][]string{{"绿茶", "饮料"}, {"咖啡", "饮料"}, {"乌龙", "饮料"}}, Prompt: "为{{商品名称}}写文案",
			},
		},
		{
			name: "encoding detected", file: "gbk.csv", body: gbk,
			want: web.Inspection{Filename: "gbk.csv", Encoding: "gb18030", Columns: []string{"商品", "n"}, Rows: 1, Sample: [][]string{{"茶", "1"}}},
		},
		{
			name: "encoding given", file: "latin.csv", body: []byte("caf\xe9,n\nx,1\n"), fields: map[string]string{"encoding": "windows-1252"},
			want: web.Inspection{Filename: "latin.csv", Encoding: "windows-1252", Columns: []string{"café", "n"}, Rows: 1, Sample: [][]string{{"x", "1"}}},
		},
		{
			// The page sends the first bytes of a CSV too large to send
			// whole: the cut last line is never read.
			name: "the head of a larger CSV", file: "big.csv", body: []byte("sku,name\nA-1,Tea\n\nA-2,Coffee\nA-3,Cocoa\nA-4,\"Mi"), fields: map[string]string{"partial": "head"},
			want: web.Inspection{Filename: "big.csv", Encoding: "utf-8", Columns: []string{"sku", "name"}, Rows: 4, Sample: [][]string{{"A-1", "Tea"}, {"A-2", "Coffee"}, {"A-3", "Cocoa"}}, Partial: true},
		},
		{
			name: "the head cut inside a character", file: "cut.csv", body: []byte("sku,name\nA-1,绿茶\nA-2,\xe7\xbb"), fields: map[string]string{"partial": "head"},
			want: web.Inspection{Filename: "cut.csv", Encoding: "utf-8", Columns: []string{"sku", "name"}, Rows: 1, Sample: [][]string{{"A-1", "绿茶"}}, Partial: true},
		},
		{
			name: "the head of a CSV that ends within it", file: "small.csv", body: []byte("sku\nA-1\n"), fields: map[string]string{"partial": "head"},
			want: web.Inspection{Filename: "small.csv", Encoding: "utf-8", Columns: []string{"sku"}, Rows: 1, Sample: [][]string{{"A-1"}}, Partial: true},
		},
		{
			name: "a path in the name is dropped", file: `C:\Users\ops\..\data.csv`, body: []byte("a\n1\n"),
			want: web.Inspection{Filename: "data.csv", Encoding: "utf-8", Columns: []string{"a"}, Rows: 1, Sample: [][]string{{"1"}}},
		},
	}
	// A result sent back in: its columns are the input's, and the page hears what starting it would do.
	key := func(name string) string { return pipeline.RowKey(store.TaskSpec{Prompt: "写{{名称}}"}, "写"+name) }
	header := append([]any{"名称"}, anySlice(pipeline.ResultColumns)...)
	resultRow := func(name, output, rerun, key string) []any {
		r := make([]any, len(header))
		r[0] = name
		for i, c := range pipeline.ResultColumns {
			switch c {
			case "output":
				r[1+i] = output
			case "status":
				r[1+i] = "succeeded"
			case "rerun":
				r[1+i] = rerun
			case "batchgen_key":
				r[1+i] = key
			}
		}
		return r
	}
	result := workbook(t, [][]any{header, resultRow("绿茶", "答", "", key("绿茶")), resultRow("咖啡", "答", "再来", key("咖啡")),
		resultRow("红茶", "", "", key("红茶")), {"新茶"}}, "写{{名称}}")
	tests = append(tests, struct {
		name   string
		file   string
		body   []byte
		fields map[string]string
		want   web.Inspection
	}{
		name: "a result sent back in", file: "商品.result.xlsx", body: result,
		want: web.Inspection{Filename: "商品.result.xlsx", Sheet: "商品", Columns: []string{"名称"}, Rows: 4,
			Sample: [][]string{{"绿茶"}, {"咖啡"}, {"红茶"}}, Prompt: "写{{名称}}",
			Rerun: &pipeline.RerunCounts{Kept: 1, Flagged: 1, Cleared: 1, New: 1}},
	})
	h := web.New(web.Config{})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body, ct := form(t, tc.file, tc.body, tc.fields)
			req := httptest.NewRequest(http.MethodPost, web.InspectPath, body)
			req.Header.Set("Content-Type", ct)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d, body %s", rec.Code, rec.Body)
			}
			var got web.Inspection
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("inspection (-want +got):\n%s", diff)
			}
		})
	}
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// TestInspectRejects checks that a bad upload gets the API's error shape with
// the reason the reader gives, in words a person can act on.
func TestInspectRejects(t *testing.T) {
	t.Parallel()
	type errBody struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	tests := []struct {
		name        string
		file        string
		body        []byte
		fields      map[string]string
		contentType string // overrides the multipart type
		auth        func(*http.Request) error
		wantStatus  int
		wantCode    string
		wantMessage []string // substrings
	}{
		{name: "header without rows", file: "empty.csv", body: []byte("sku,name\n"), wantStatus: 400, wantCode: "invalid_sheet", wantMessage: []string{"empty.csv", "no data rows"}},
		{name: "duplicate header", file: "dup.csv", body: []byte("a,a\n1,2\n"), wantStatus: 400, wantCode: "invalid_sheet", wantMessage: []string{"dup.csv", `"a"`}},
		{name: "not a sheet", file: "photo.xlsx", body: []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), wantStatus: 400, wantCode: "invalid_sheet", wantMessage: []string{"photo.xlsx"}},
		{name: "too large", file: "big.csv", body: bytes.Repeat([]byte("a,b\n"), 600), wantStatus: 413, wantCode: "file_too_large", wantMessage: []string{"big.csv", "larger than"}},
		{name: "no file", wantStatus: 400, wantCode: "invalid_request", wantMessage: []string{`"file"`}},
		{name: "unknown partial", file: "ok.csv", body: []byte("a\n1\n"), fields: map[string]string{"partial": "tail"}, wantStatus: 400, wantCode: "invalid_request", wantMessage: []string{`"partial"`, `"head"`}},
		{name: "a cut CSV read whole", file: "cut.csv", body: []byte("a,b\n1,\"x"), wantStatus: 400, wantCode: "invalid_sheet", wantMessage: []string{"cut.csv"}},
		{name: "not multipart", contentType: "application/json", wantStatus: 415, wantCode: "unsupported_media_type", wantMessage: []string{"multipart/form-data"}},
		{name: "unauthenticated", file: "ok.csv", body: []byte("a\n1\n"), auth: func(*http.Request) error { return errors.New("no token") }, wantStatus: 401, wantCode: "unauthorized", wantMessage: []string{"token"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := web.New(web.Config{Limits: api.Limits{MaxFileBytes: 2000}, Authenticate: tc.auth})
			body, ct := form(t, tc.file, tc.body, tc.fields)
			if tc.contentType != "" {
				ct = tc.contentType
			}
			req := httptest.NewRequest(http.MethodPost, web.InspectPath, body)
			req.Header.Set("Content-Type", ct)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			var got errBody
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("body is not the error JSON: %v: %s", err, rec.Body)
			}
			if rec.Code != tc.wantStatus || got.Error.Code != tc.wantCode {
				t.Fatalf("got %d %q, want %d %q (%s)", rec.Code, got.Error.Code, tc.wantStatus, tc.wantCode, got.Error.Message)
			}
			for _, s := range tc.wantMessage {
				if !strings.Contains(got.Error.Message, s) {
					t.Errorf("message %q does not mention %q", got.Error.Message, s)
				}
			}
		})
	}
}

func TestServesThePage(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(web.New(web.Config{}))
	defer srv.Close()
	tests := []struct {
		path, wantType string
		wantStatus     int
		wantBody       string
	}{
		{path: "/", wantType: "text/html", wantStatus: 200, wantBody: `<script src="/ui/app.js"`},
		{path: "/ui/app.js", wantType: "text/javascript", wantStatus: 200, wantBody: "/api/tasks"},
		{path: "/ui/strings.js", wantType: "text/javascript", wantStatus: 200, wantBody: "我的任务"},
		{path: "/ui/app.css", wantType: "text/css", wantStatus: 200, wantBody: ".bar-fill"},
		{path: "/ui/missing.js", wantStatus: 404},
		{path: "/elsewhere", wantStatus: 404},
		{path: "/ui/inspect", wantStatus: 405},
	}
	for _, tc := range tests {
		resp, err := http.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.wantStatus {
			t.Errorf("GET %s: status %d, want %d", tc.path, resp.StatusCode, tc.wantStatus)
			continue
		}
		if tc.wantStatus != 200 {
			continue
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, tc.wantType) {
			t.Errorf("GET %s: Content-Type %q, want %s", tc.path, ct, tc.wantType)
		}
		if !strings.Contains(string(body), tc.wantBody) {
			t.Errorf("GET %s: body lacks %q", tc.path, tc.wantBody)
		}
		if resp.Header.Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: no Content-Security-Policy", tc.path)
		}
	}
}

// TestPageConfig: GET /ui/config.json tells the page the largest sheet it
// may send inside a request, never more than the server accepts at all,
// and the API's rule for a task's model, and needs no token (the page
// reads it before it has one).
func TestPageConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  web.Config
		want web.PageConfig
	}{
		{name: "defaults: no bound of its own", want: web.PageConfig{MaxInlineBytes: sheet.DefaultMaxFileBytes, MaxFileBytes: sheet.DefaultMaxFileBytes}},
		{
			name: "a proxy's bound",
			cfg:  web.Config{Limits: api.Limits{MaxFileBytes: 100 << 20}, MaxInlineBytes: 4 << 20},
			want: web.PageConfig{MaxInlineBytes: 4 << 20, MaxFileBytes: 100 << 20},
		},
		{
			name: "never above the file limit",
			cfg:  web.Config{Limits: api.Limits{MaxFileBytes: 1 << 20}, MaxInlineBytes: 4 << 20},
			want: web.PageConfig{MaxInlineBytes: 1 << 20, MaxFileBytes: 1 << 20},
		},
		{
			name: "the models a task may name",
			cfg:  web.Config{Limits: api.Limits{Models: []string{"gpt-4o-mini", "gpt-4o"}}},
			want: web.PageConfig{MaxInlineBytes: sheet.DefaultMaxFileBytes, MaxFileBytes: sheet.DefaultMaxFileBytes, Models: []string{"gpt-4o-mini", "gpt-4o"}},
		},
		{
			name: "a routed deployment fixes the model",
			cfg:  web.Config{Limits: api.Limits{ModelFixed: "rows are routed over east, west"}},
			want: web.PageConfig{MaxInlineBytes: sheet.DefaultMaxFileBytes, MaxFileBytes: sheet.DefaultMaxFileBytes, ModelFixed: "rows are routed over east, west"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.cfg.Authenticate = func(*http.Request) error { return errors.New("no token") }
			rec := httptest.NewRecorder()
			web.New(tc.cfg).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, web.ConfigPath, nil))
			if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
				t.Fatalf("GET %s without a token = %d %q %s, want 200 JSON", web.ConfigPath, rec.Code, rec.Header().Get("Content-Type"), rec.Body)
			}
			var got web.PageConfig
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("page config (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStringTablesMatch keeps the two languages in step: a key in one table
// but not the other would show a raw key to half the users.
func TestStringTablesMatch(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(web.New(web.Config{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/ui/strings.js")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	js, _ := io.ReadAll(resp.Body)
	tables := parseStringTables(t, string(js))
	en, zh := tables["en"], tables["zh"]
	if len(en) < 20 {
		t.Fatalf("found only %d English strings; is the table's layout what parseStringTables expects?", len(en))
	}
	var onlyEN, onlyZH []string
	for k := range en {
		if _, ok := zh[k]; !ok {
			onlyEN = append(onlyEN, k)
		}
	}
	for k := range zh {
		if _, ok := en[k]; !ok {
			onlyZH = append(onlyZH, k)
		}
	}
	if len(onlyEN)+len(onlyZH) > 0 {
		t.Errorf("keys only in en: %v; only in zh: %v", onlyEN, onlyZH)
	}

	// Every data-i18n key the page and script use is in the table.
	page, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer page.Body.Close()
	html, _ := io.ReadAll(page.Body)
	for _, key := range i18nKeys(string(html)) {
		if _, ok := en[key]; !ok {
			t.Errorf("index.html uses %q, which strings.js lacks", key)
		}
	}
}
