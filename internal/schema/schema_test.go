package schema

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

func TestParseShort(t *testing.T) {
	tests := []struct {
		in   string
		want Columns
	}{
		{"", nil},
		{"  ", nil},
		{"category:enum(家居|数码|服饰), score:number, in_stock:boolean, summary:text", Columns{
			{Name: "category", Type: Enum, Values: []string{"家居", "数码", "服饰"}},
			{Name: "score", Type: Number},
			{Name: "in_stock", Type: Boolean},
			{Name: "summary", Type: Text},
		}},
		{"score:number!, summary", Columns{{Name: "score", Type: Number, Required: true}, {Name: "summary", Type: Text}}},
		{"band: enum( low | mid, high | top )!", Columns{{Name: "band", Type: Enum, Values: []string{"low", "mid, high", "top"}, Required: true}}},
		{"a:int\nb:Bool\r\nc:string,d:float,e:date,f:list,", Columns{
			{Name: "a", Type: Integer}, {Name: "b", Type: Boolean}, {Name: "c", Type: Text},
			{Name: "d", Type: Number}, {Name: "e", Type: Date}, {Name: "f", Type: List},
		}},
		{"price band:ENUM(a)", Columns{{Name: "price band", Type: Enum, Values: []string{"a"}}}},
	}
	for _, tt := range tests {
		got, err := ParseShort(tt.in)
		if err != nil {
			t.Errorf("ParseShort(%q): %v", tt.in, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("ParseShort(%q) (-want +got):\n%s", tt.in, diff)
		}
	}
}

func TestParseShortRefuses(t *testing.T) {
	tests := []struct{ in, want string }{
		{"score:nmber", `column 1 ("score:nmber"): unknown type "nmber"; the types are text, number`},
		{"a:text, :number", `column 2 (":number"): the name is empty`},
		{"a:text, A:number", `column 2 ("A"): the same name as column 1`},
		{"c:enum()", `column 1 ("c"): an enum needs at least one value`},
		{"c:enum(a||b)", `column 1 ("c"): an enum value is blank`},
		{"c:enum(a|a)", `the enum value "a" appears twice`},
		{"c:number(1|2)", `only enum takes values in parentheses, not number`},
		{"c:enum(a|b", `a ( is not closed`},
		{"c:enum(a)x", `text after the closing parenthesis`},
		{"c:text)", `a ) at character 7 closes nothing`},
		{"c:", `no type after the colon`},
		{strings.Repeat("c,", 0) + manyColumns(101), `101 columns declared; at most 100 are allowed`},
	}
	for _, tt := range tests {
		_, err := ParseShort(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseShort(%.40q) = %v, want an error containing %q", tt.in, err, tt.want)
		}
	}
	if _, err := ParseShort(manyColumns(100)); err != nil {
		t.Errorf("100 columns: %v", err)
	}
}

func manyColumns(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = "c" + strings.Repeat("x", i)
	}
	return strings.Join(parts, ",")
}

func TestParseJSONSchema(t *testing.T) {
	doc := `{
	  "type": "object",
	  "properties": {
	    "summary": {"type": "string", "description": "one line"},
	    "category": {"type": "string", "enum": ["家居", "数码"]},
	    "band": {"enum": ["low", "high", null]},
	    "score": {"type": ["number", "null"]},
	    "count": {"type": "integer"},
	    "in_stock": {"type": "boolean"},
	    "launched": {"type": "string", "format": "date"},
	    "tags": {"type": "array", "items": {"type": "string"}}
	  },
	  "required": ["category", "score"]
	}`
	got, err := ParseJSONSchema([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := Columns{
		{Name: "summary", Type: Text, Description: "one line"},
		{Name: "category", Type: Enum, Values: []string{"家居", "数码"}, Required: true},
		{Name: "band", Type: Enum, Values: []string{"low", "high"}},
		{Name: "score", Type: Number}, // required but nullable: optional
		{Name: "count", Type: Integer},
		{Name: "in_stock", Type: Boolean},
		{Name: "launched", Type: Date},
		{Name: "tags", Type: List},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("columns in document order (-want +got):\n%s", diff)
	}
}

func TestParseJSONSchemaRefuses(t *testing.T) {
	tests := []struct{ doc, want string }{
		{`[1,2]`, "not a JSON Schema object"},
		{`{"type": "array", "items": {}}`, `the schema's type is "array"`},
		{`{"type": "object"}`, "the schema has no properties"},
		{`{"properties": {"a": {"type": "object"}}}`, `property "a": a nested object`},
		{`{"properties": {"a": {"type": "whatever"}}}`, `property "a": unknown type "whatever"`},
		{`{"properties": {"a": {"description": "x"}}}`, `property "a": no type`},
		{`{"properties": {"a": {"enum": []}}}`, `column 1 ("a"): an enum needs at least one value`},
		{`{"properties": {"a": {"enum": [1, 2]}}}`, `property "a": enum value 1 is not text`},
		{`{"properties": {"a": {"type": ["string", "number"]}}}`, `a column holds one type of value`},
		{`{"properties": {"a": {"type": "array", "items": {"type": "object"}}}}`, `a list column holds text items`},
		{`{"properties": {"a": {"type": "string"}}, "required": ["b"]}`, `required names "b", which is not a property`},
		{`{"properties": {"a": {"type": "string"}, "a": {"type": "number"}}}`, `"a" appears twice`},
		{`{"properties": {"": {"type": "string"}}}`, `the name is empty`},
		{`{"properties": `, "not JSON"},
	}
	for _, tt := range tests {
		_, err := ParseJSONSchema([]byte(tt.doc))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseJSONSchema(%s) = %v, want an error containing %q", tt.doc, err, tt.want)
		}
	}
}

// example is a declaration with every type, required and not.
var example = Columns{
	{Name: "category", Type: Enum, Values: []string{"家居", "数码", "服饰"}, Required: true},
	{Name: "band", Type: Enum, Values: []string{"low", "high"}},
	{Name: "score", Type: Number},
	{Name: "count", Type: Integer, Required: true},
	{Name: "in_stock", Type: Boolean},
	{Name: "launched", Type: Date},
	{Name: "tags", Type: List},
	{Name: "summary", Type: Text, Required: true, Description: "one line <b>"},
}

func TestValidateNormalises(t *testing.T) {
	tests := []struct{ name, answer, want string }{
		{"strict shape",
			`{"category":"数码","band":"low","score":4.5,"count":3,"in_stock":true,"launched":"2026-12-01","tags":["a","b"],"summary":"ok"}`,
			`{"category":"数码","band":"low","score":4.5,"count":3,"in_stock":true,"launched":"2026-12-01","tags":["a","b"],"summary":"ok"}`},
		{"optional ones null or missing, extra dropped",
			`{"category":"家居","count":1,"summary":"x","band":null,"extra":1}`,
			`{"category":"家居","band":null,"score":null,"count":1,"in_stock":null,"launched":null,"tags":null,"summary":"x"}`},
		{"lenient forms in a fence",
			"```json\n" + `{"Category":" 服饰 ","band":"HIGH","score":"12.50","count":3.0,"in_stock":"False","launched":"2026-12-01T10:00:00Z","tags":"one","summary":7}` + "\n```",
			`{"category":"服饰","band":"high","score":12.5,"count":3,"in_stock":false,"launched":"2026-12-01","tags":["one"],"summary":"7"}`},
		{"blank optional number is empty",
			`{"category":"数码","score":"","count":0,"summary":"s","tags":[1,true,null,"x"]}`,
			`{"category":"数码","band":null,"score":null,"count":0,"in_stock":null,"launched":null,"tags":["1","true","x"],"summary":"s"}`},
	}
	for _, tt := range tests {
		got, err := example.Validate(tt.answer)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if got != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.name, got, tt.want)
		}
		again, err := example.Validate(got)
		if err != nil || again != got {
			t.Errorf("%s: a normalised answer is not its own normal form: %s, %v", tt.name, again, err)
		}
	}
}

func TestValidateRefuses(t *testing.T) {
	tests := []struct {
		name, answer string
		want         []string
	}{
		{"not json", "Sure! Here it is.", []string{"the answer is not JSON"}},
		{"empty", "  ", []string{"the answer is empty"}},
		{"an array", `[1]`, []string{"the answer is a JSON list, not an object"}},
		{"trailing text", `{"category":"数码"} thanks`, []string{"text after its JSON object"}},
		{"every column wrong", `{"category":"food","band":3,"score":"high","count":2.5,"in_stock":"maybe","launched":"12/01/2026","tags":{"a":1},"summary":""}`, []string{
			`"category": want one of "家居", "数码", "服饰", got text "food"`,
			`"band": want one of "low", "high", got number 3`,
			`"score": want a number, got text "high"`,
			`"count": want a whole number, got number 2.5`,
			`"in_stock": want true or false, got text "maybe"`,
			`"launched": want a date as YYYY-MM-DD, got text "12/01/2026"`,
			`"tags": want a list of texts, got object {"a":1}`,
			`"summary": empty, and it is required`,
		}},
		{"required missing", `{"count":1,"summary":"s"}`, []string{`"category": missing, and it is required`}},
		{"boolean as 1", `{"category":"数码","count":1,"summary":"s","in_stock":"1"}`, []string{`"in_stock": want true or false, got text "1"`}},
		{"long value quoted briefly", `{"category":"` + strings.Repeat("x", 500) + `","count":1,"summary":"s"}`, []string{`got text "xxxxxxxx`, `…`}},
	}
	for _, tt := range tests {
		_, err := example.Validate(tt.answer)
		var invalid *InvalidAnswerError
		if !errors.As(err, &invalid) {
			t.Errorf("%s: Validate = %v, want an *InvalidAnswerError", tt.name, err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tt.name, err, w)
			}
		}
		if strings.Contains(err.Error(), strings.Repeat("x", 100)) {
			t.Errorf("%s: the problem quotes the whole value", tt.name)
		}
	}
}

// TestJSONSchemaAcceptsWhatValidateKeeps holds the schema sent to providers
// against the check the answers pass, with a real JSON Schema validator:
// every normalised answer fits the schema, and the wrong ones the check
// refuses the schema refuses too.
func TestJSONSchemaAcceptsWhatValidateKeeps(t *testing.T) {
	sch := compile(t, example.JSONSchema())
	for _, answer := range []string{
		`{"category":"数码","band":"low","score":4.5,"count":3,"in_stock":true,"launched":"2026-12-01","tags":["a","b"],"summary":"ok"}`,
		`{"category":"家居","count":1,"summary":"x"}`,
	} {
		norm, err := example.Validate(answer)
		if err != nil {
			t.Fatal(err)
		}
		if err := sch.Validate(decode(t, norm)); err != nil {
			t.Errorf("%s does not fit the schema sent to providers: %v", norm, err)
		}
	}
	for _, wrong := range []string{
		`{"category":"food","band":null,"score":null,"count":1,"in_stock":null,"launched":null,"tags":null,"summary":"x"}`,
		`{"category":"数码","band":null,"score":null,"count":1.5,"in_stock":null,"launched":null,"tags":null,"summary":"x"}`,
		`{"category":"数码","band":null,"score":null,"count":1,"in_stock":null,"launched":null,"tags":null}`,
		`{"category":"数码","band":null,"score":null,"count":1,"in_stock":null,"launched":null,"tags":null,"summary":"x","more":1}`,
	} {
		if err := sch.Validate(decode(t, wrong)); err == nil {
			t.Errorf("the schema sent to providers accepts %s", wrong)
		}
	}
	var doc map[string]any
	if err := json.Unmarshal(example.JSONSchema(), &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(example.JSONSchema()), `"description":"one line <b>"`) {
		t.Errorf("the description is escaped or lost: %s", example.JSONSchema())
	}
	// Property order is the column order: the model writes them in it.
	if s := string(example.JSONSchema()); strings.Index(s, `"category"`) > strings.Index(s, `"summary"`) {
		t.Errorf("properties out of order: %s", s)
	}
}

// TestJSONSchemaRoundTrip reads the schema sent to providers back as a
// declaration: --schema accepts what batchgen writes.
func TestJSONSchemaRoundTrip(t *testing.T) {
	got, err := ParseJSONSchema(example.JSONSchema())
	if err != nil {
		t.Fatal(err)
	}
	want := append(Columns(nil), example...)
	want[5].Description = "(a date as YYYY-MM-DD)"
	want[7].Description = "one line <b>"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestCells(t *testing.T) {
	norm, err := example.Validate(`{"category":"数码","score":4.5,"count":3,"in_stock":false,"launched":"2026-02-03","tags":["a","b"],"summary":"ok"}`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := example.Cells(norm)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Text != "数码" || !got[1].Empty || got[2].Number != 4.5 || got[3].Number != 3 || got[4].Bool || got[4].Empty ||
		got[5].Date.Format("2006-01-02") != "2026-02-03" || got[6].Text != "a; b" || got[7].Text != "ok" {
		t.Errorf("cells: %+v", got)
	}
	if _, err := example.Cells(`{"category":1}`); err == nil || !strings.Contains(err.Error(), `"category": the stored value is number, not enum`) {
		t.Errorf("a stored answer of another declaration: %v", err)
	}
	if _, err := example.Cells(`plain text`); err == nil {
		t.Error("a plain text answer read as cells")
	}
}

func TestFollowUpSaysWhatWasWrong(t *testing.T) {
	_, err := example.Validate(`{"category":"food","count":1,"summary":"s"}`)
	var invalid *InvalidAnswerError
	if !errors.As(err, &invalid) {
		t.Fatal(err)
	}
	f := example.FollowUp(invalid)
	for _, w := range []string{`"category": want one of`, `JSON object`, `"launched": a date as "YYYY-MM-DD", or null`, `"count": a whole number, required`, `(one line <b>)`} {
		if !strings.Contains(f, w) {
			t.Errorf("the follow-up does not say %q:\n%s", w, f)
		}
	}
}

func compile(t *testing.T, schema []byte) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("answer.json", decode(t, string(schema))); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("answer.json")
	if err != nil {
		t.Fatalf("the schema sent to providers is not a valid JSON Schema: %v\n%s", err, schema)
	}
	return sch
}

func decode(t *testing.T, s string) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestParseJSON(t *testing.T) {
	want := Columns{{Name: "category", Type: Enum, Values: []string{"a", "b"}, Required: true}, {Name: "score", Type: Number}}
	for _, in := range []string{
		`"category:enum(a|b)!, score:number"`,
		`[{"name": "category", "type": "enum", "values": ["a", "b"], "required": true}, {"name": "score", "type": "float"}]`,
		`{"type": "object", "properties": {"category": {"enum": ["a", "b"]}, "score": {"type": "number"}}, "required": ["category"]}`,
	} {
		got, err := ParseJSON([]byte(in))
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", in, diff)
		}
	}
	for _, in := range []string{"", "null", " "} {
		if got, err := ParseJSON([]byte(in)); got != nil || err != nil {
			t.Errorf("%q: %v, %v; want no declaration", in, got, err)
		}
	}
	for in, want := range map[string]string{
		`3`:                                "give a string",
		`[{"name": "a", "type": "nmber"}]`: `column 1 ("a"): unknown type "nmber"`,
		`[{"type": "text"}]`:               "column 1: no name",
		`[{"name": "a", "kind": "text"}]`:  `unknown field "kind"`,
		`[{"name": "a", "type": "enum"}]`:  "an enum needs at least one value",
		`"a:text, a:number"`:               "the same name as column 1",
	} {
		if _, err := ParseJSON([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
}

func TestParseTable(t *testing.T) {
	rows := [][]string{
		{"notes for the team"},
		{},
		{"Type", "Column", "Description", "Required"},
		{"enum(家居|数码)", "category", "", "TRUE"},
		{"number!", "score", "0 to 10"},
		{"", "summary", "one line", ""},
		{},
		{"ignored", "after the blank row"},
	}
	got, err := ParseTable(rows, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := Columns{
		{Name: "category", Type: Enum, Values: []string{"家居", "数码"}, Required: true},
		{Name: "score", Type: Number, Required: true, Description: "0 to 10"},
		{Name: "summary", Type: Text, Description: "one line"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	back, err := ParseTable(example.Table(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(example, back); diff != "" {
		t.Errorf("Table does not read back (-want +got):\n%s", diff)
	}
	if cols, err := ParseTable([][]string{{"just a note"}, {"type"}}, 2); cols != nil || err != nil {
		t.Errorf("no header row: %v, %v", cols, err)
	}
	for _, tc := range []struct {
		rows [][]string
		want string
	}{
		{[][]string{{"column", "type"}, {"a", "nmber"}}, `row 3 ("a"): unknown type "nmber"`},
		{[][]string{{"column", "type"}, {"", "text"}}, `row 3: the column has no name`},
		{[][]string{{"column", "type"}}, `row 2: a table of output columns with no column below its header`},
		{[][]string{{"column", "type"}, {"a", "text"}, {"A", "number"}}, `the same name as column 1`},
	} {
		if _, err := ParseTable(tc.rows, 2); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.rows, err, tc.want)
		}
	}
}

// TestParseText: a field or file of text holds the short form or JSON, told apart by its first character; the
// API's form, the drop folder's sidecar and the stack's DEFAULT_COLUMNS all read it this way.
func TestParseText(t *testing.T) {
	for _, in := range []string{"score:number", ` [{"name": "score", "type": "number"}]`, `{"properties": {"score": {"type": "number"}}}`, `"score:number"`} {
		got, err := ParseText(in)
		if err != nil || len(got) != 1 || got[0].Name != "score" || got[0].Type != Number {
			t.Errorf("ParseText(%q) = %+v, %v", in, got, err)
		}
	}
	if got, err := ParseText("  \n"); got != nil || err != nil {
		t.Errorf("blank: %v, %v", got, err)
	}
}
