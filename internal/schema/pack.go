package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// MaxRowsPerCall is the most rows one packed call may answer.
const MaxRowsPerCall = 100

// PackItem is one row of a packed call: its id (unique in the call) and
// its rendered prompt.
type PackItem struct {
	ID     string
	Prompt string
}

// packIntro opens a packed prompt; the items follow, each in an <item>
// element, so that a model (and the mock server) can tell where one ends.
const packIntro = "Answer each item below on its own, as if it were the only question. " +
	"Reply with only a JSON object {\"answers\": [...]} holding exactly one answer per item, each with the item's id."

// PackPrompt is the prompt of a call that answers several rows: the
// instruction, then each row's prompt inside <item id="..."> and
// </item>, in order.
func PackPrompt(items []PackItem) string {
	var b strings.Builder
	b.WriteString(packIntro)
	for _, it := range items {
		b.WriteString("\n\n<item id=\"")
		b.WriteString(it.ID)
		b.WriteString("\">\n")
		b.WriteString(it.Prompt)
		b.WriteString("\n</item>")
	}
	return b.String()
}

var packItemPattern = regexp.MustCompile(`(?s)<item id="([^"]*)">\n(.*?)\n</item>`)

// UnpackPrompt reads the items of a prompt PackPrompt wrote (for a server
// that answers packed calls: the mock), or nil for any other prompt.
func UnpackPrompt(prompt string) []PackItem {
	if !strings.HasPrefix(prompt, packIntro) {
		return nil
	}
	var items []PackItem
	for _, m := range packItemPattern.FindAllStringSubmatch(prompt, -1) {
		items = append(items, PackItem{ID: m[1], Prompt: m[2]})
	}
	return items
}

// AnswerProperty holds a packed item's answer when no columns are
// declared: {"id": "7", "answer": "the text"}.
const AnswerProperty = "answer"

// PackedJSONSchema is the schema of an answer to a packed call:
// {"answers": [...]}, each item an object with its id and, for declared
// columns, their properties (JSONSchema's rules), or else the answer's
// text.
func (cs Columns) PackedJSONSchema() json.RawMessage {
	item := cs
	if len(item) == 0 {
		item = Columns{{Name: AnswerProperty, Type: Text, Required: true}}
	}
	one := string(append(Columns{{Name: "id", Type: Text, Required: true}}, item...).JSONSchema())
	return json.RawMessage(`{"type":"object","properties":{"answers":{"type":"array","items":` + one +
		`}},"required":["answers"],"additionalProperties":false}`)
}

// SplitPacked reads the answer to a packed call asking for ids: for each
// id answered exactly once with an answer that fits, its output (for
// columns the normalised answer, as Validate returns it; else the text);
// for every other id, why it has none (not answered, answered twice, or
// the problems of its answer). Items with ids that were not asked for are
// ignored. err is an answer that cannot be read at all: every row is then
// without one.
func (cs Columns) SplitPacked(answer string, ids []string) (outputs, problems map[string]string, err error) {
	obj, err := decodeObject(answer)
	if err != nil {
		return nil, nil, err
	}
	raw, ok := lookup(obj, "answers")
	list, isList := raw.([]any)
	if !ok || !isList {
		return nil, nil, errors.New(`the answer has no list "answers"`)
	}
	asked := make(map[string]bool, len(ids))
	for _, id := range ids {
		asked[id] = true
	}
	items := make(map[string][]map[string]any, len(ids))
	for _, it := range list {
		m, ok := it.(map[string]any)
		if !ok {
			continue
		}
		id := itemID(m["id"])
		if asked[id] {
			items[id] = append(items[id], m)
		}
	}
	outputs, problems = make(map[string]string, len(ids)), make(map[string]string)
	for _, id := range ids {
		got := items[id]
		switch {
		case len(got) == 0:
			problems[id] = "the packed answer has no item with this id"
			continue
		case len(got) > 1:
			problems[id] = fmt.Sprintf("the packed answer has %d items with this id", len(got))
			continue
		}
		delete(got[0], "id")
		if len(cs) == 0 {
			text, _ := got[0][AnswerProperty].(string)
			if strings.TrimSpace(text) == "" {
				problems[id] = "the item's answer is empty"
				continue
			}
			outputs[id] = text
			continue
		}
		b, _ := json.Marshal(got[0]) // decoded JSON always marshals
		norm, err := cs.Validate(string(b))
		if err != nil {
			problems[id] = err.Error()
			continue
		}
		outputs[id] = norm
	}
	return outputs, problems, nil
}

// itemID reads an item's id, written as text or as a number.
func itemID(v any) string {
	switch v := v.(type) {
	case string:
		return strings.TrimSpace(v)
	case json.Number:
		return v.String()
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return ""
}

// PackedText is the answer a server gives to a packed call whose items it
// answered one by one (answers[i] is items[i]'s answer: for declared
// columns its JSON object, else its text), for the simulator and the mock.
func PackedText(items []PackItem, answers []string, structured bool) string {
	var b bytes.Buffer
	b.WriteString(`{"answers":[`)
	for i, it := range items {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"id":`)
		writeJSON(&b, it.ID)
		if structured {
			// The item's own object, its properties after the id.
			obj := strings.TrimSpace(answers[i])
			if strings.HasPrefix(obj, "{") && len(obj) > 2 {
				b.WriteByte(',')
				b.WriteString(obj[1:])
				continue
			}
			b.WriteByte('}')
			continue
		}
		b.WriteString(`,"` + AnswerProperty + `":`)
		writeJSON(&b, answers[i])
		b.WriteByte('}')
	}
	b.WriteString(`]}`)
	return b.String()
}

// SampleAnswer is an answer that fits cs, for servers that stand in for a model (the simulator, the mock): each
// column's value is drawn from draw(i) (a number, an integer, a boolean, an enum value, a date in 2026), and its
// text (a text column's, and a list's first item beside the column's name) is text(c), which a stand-in makes
// quote the row's prompt so a test can tell whose answer it is.
func (cs Columns) SampleAnswer(draw func(i int) uint64, text func(c Column) string) string {
	values := make([]any, len(cs))
	for i, c := range cs {
		x := draw(i)
		switch c.Type {
		case Number:
			values[i] = float64(x%100000) / 100
		case Integer:
			values[i] = x % 1000
		case Boolean:
			values[i] = x&1 == 1
		case Enum:
			values[i] = c.Values[x%uint64(len(c.Values))]
		case Date:
			values[i] = sampleEpoch.AddDate(0, 0, int(x%365)).Format(time.DateOnly)
		case List:
			values[i] = []string{text(c), c.Name}
		default:
			values[i] = text(c)
		}
	}
	return cs.object(values)
}

// sampleEpoch is the first day of SampleAnswer's dates.
var sampleEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
