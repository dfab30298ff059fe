package sheet

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/text/encoding"
	"golang.org/x/text/encoding/charmap"
	"golang.org/x/text/encoding/japanese"
	"golang.org/x/text/encoding/simplifiedchinese"
	"golang.org/x/text/encoding/traditionalchinese"
	xunicode "golang.org/x/text/encoding/unicode"
)

const encodingsDir = "testdata/encodings"

// excelBytes is text as Excel writes it with "Save as CSV" on a machine whose ANSI code page is enc: CRLF line
// ends, no byte-order mark, every character in that code page.
func excelBytes(t testing.TB, enc encoding.Encoding, text string) []byte {
	t.Helper()
	text = string(bytes.ReplaceAll([]byte(text), []byte("\n"), []byte("\r\n")))
	b, err := enc.NewEncoder().Bytes([]byte(text))
	if err != nil {
		t.Fatalf("encode %q: %v", text, err)
	}
	return b
}

// encodingCorpus generates the excel_*.csv files of testdata/encodings (see its README.md); the public_* files there
// are real files from public repositories and are not generated.
func encodingCorpus(t testing.TB) map[string][]byte {
	t.Helper()
	utf16 := xunicode.UTF16(xunicode.LittleEndian, xunicode.UseBOM)
	return map[string][]byte{
		// French Excel writes ";" and Windows-1252. Every accented letter here is followed by a letter, so the
		// bytes are also valid GB18030: "Cat\xE9gorie" decodes as "Cat間orie".
		"excel_fr_windows-1252_also_gb18030.csv": excelBytes(t, charmap.Windows1252,
			"Catégorie;Entrées;Prix\nLégumes;Carottes râpées;2\nCrème brûlée;Desserts glacés;5\nFaçade;Très chère;7\n"),
		// German Excel: ";" and Windows-1252, with umlauts and ß at word ends (not valid GB18030).
		"excel_de_windows-1252.csv": excelBytes(t, charmap.Windows1252,
			"Artikel;Größe;Beschreibung\nMüsli;500 g;Hafer, Nüsse und Äpfel\nStraße;groß;„schön“ – 5 €\n"),
		// Chinese (Simplified) Excel writes code page 936 (GBK, which GB18030 extends). No byte is one of the five
		// Windows-1252 leaves unassigned, so the bytes are also valid Windows-1252 ("ÉÌÆ·Ãû³Æ").
		"excel_zh_gb18030_also_windows-1252.csv": excelBytes(t, simplifiedchinese.GBK,
			"商品名称,类目,卖点\n有机苹果,生鲜/水果,产地直发，脆甜多汁\n纯牛奶,乳品,每天一杯，营养健康\n"),
		// Chinese (Traditional) Excel writes code page 950 (Big5).
		"excel_zh-tw_big5.csv": excelBytes(t, traditionalchinese.Big5,
			"商品名稱,類別,說明\n有機蘋果,水果,產地直送，香甜多汁\n鮮奶,乳品,每天一杯，營養健康\n"),
		// Japanese Excel writes code page 932 (Shift_JIS).
		"excel_ja_shift_jis.csv": excelBytes(t, japanese.ShiftJIS,
			"商品名,分類,説明\nりんご,果物,産地直送、甘くてジューシー\n牛乳,乳製品,毎日一杯、カルシウムたっぷり\n"),
		// "CSV UTF-8 (Comma delimited)": a byte-order mark, then UTF-8.
		"excel_utf8_bom.csv": append([]byte("\xEF\xBB\xBF"), excelBytes(t, xunicode.UTF8, "名前,Café\nりんご,Crème brûlée\n")...),
		// "Unicode Text (*.txt)": UTF-16LE with a byte-order mark, tab-separated.
		"excel_unicode_text_utf16le.txt": excelBytes(t, utf16, "名称\tCatégorie\n苹果\tFruits\n"),
		// Two bytes that are two capital letters in Windows-1252 ("ÀÉ") and a common hanzi in GB18030 ("郎"):
		// nothing in the file tells them apart.
		"ambiguous_windows-1252_or_gb18030.csv": []byte("Code\r\n\xC0\xC9\r\n"),
	}
}

// encodingCases are the expected reads of testdata/encodings.
var encodingCases = []struct {
	file     string
	opts     Options
	encoding string
	header   []string
	first    []string // the first data record
	// alsoValid names encodings that decode the file without error too: the cases the detector must get right by
	// plausibility rather than by validity.
	alsoValid []string
}{
	{"excel_fr_windows-1252_also_gb18030.csv", Options{}, EncodingWindows1252,
		[]string{"Catégorie", "Entrées", "Prix"}, []string{"Légumes", "Carottes râpées", "2"}, []string{EncodingGB18030}},
	{"excel_de_windows-1252.csv", Options{}, EncodingWindows1252,
		[]string{"Artikel", "Größe", "Beschreibung"}, []string{"Müsli", "500 g", "Hafer, Nüsse und Äpfel"}, nil},
	{"excel_zh_gb18030_also_windows-1252.csv", Options{}, EncodingGB18030,
		[]string{"商品名称", "类目", "卖点"}, []string{"有机苹果", "生鲜/水果", "产地直发，脆甜多汁"}, []string{EncodingWindows1252, EncodingBig5}},
	{"excel_zh-tw_big5.csv", Options{}, EncodingBig5,
		[]string{"商品名稱", "類別", "說明"}, []string{"有機蘋果", "水果", "產地直送，香甜多汁"}, []string{EncodingWindows1252}},
	{"excel_ja_shift_jis.csv", Options{}, EncodingShiftJIS,
		[]string{"商品名", "分類", "説明"}, []string{"りんご", "果物", "産地直送、甘くてジューシー"}, []string{EncodingGB18030}},
	{"excel_utf8_bom.csv", Options{}, EncodingUTF8, []string{"名前", "Café"}, []string{"りんご", "Crème brûlée"}, nil},
	{"excel_unicode_text_utf16le.txt", Options{}, EncodingUTF16LE, []string{"名称", "Catégorie"}, []string{"苹果", "Fruits"}, nil},
	// Forcing settles the ambiguous file either way.
	{"ambiguous_windows-1252_or_gb18030.csv", Options{Encoding: "latin1"}, EncodingWindows1252, []string{"Code"}, []string{"ÀÉ"}, nil},
	{"ambiguous_windows-1252_or_gb18030.csv", Options{Encoding: "GBK"}, "gbk", []string{"Code"}, []string{"郎"}, nil},
	// Forcing wins over detection.
	{"excel_fr_windows-1252_also_gb18030.csv", Options{Encoding: "gb18030"}, EncodingGB18030,
		[]string{"Cat間orie", "Entr閑s", "Prix"}, []string{"L間umes", "Carottes r鈖閑s", "2"}, nil},
	// Public files (see testdata/encodings/README.md).
	{"public_basic_iso-8859-1_crlf.csv", Options{}, EncodingWindows1252,
		[]string{"first_name", "last_name", "age"}, []string{"John", "Smith", "37"}, nil},
	{"public_dao_de_jing_big5.csv", Options{}, EncodingBig5, []string{"#"}, []string{"# Spreadsheet::WriteExcel Unicode examples."}, nil},
	// Line 34 has a comma in a product spec; read as one column (tab-separated), each line is one cell.
	{"public_product_specs_shift_jis.csv", Options{DisplayName: "specs.tsv"}, EncodingShiftJIS, []string{"#"}, []string{"# Spreadsheet::WriteExcel Unicode examples."}, nil},
}

// TestEncodingCorpus checks the generated files are committed as generated (rewrite them with -update) and every
// file has a case.
func TestEncodingCorpus(t *testing.T) {
	gen := encodingCorpus(t)
	if *update {
		for name, data := range gen {
			if err := os.WriteFile(filepath.Join(encodingsDir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, data := range gen {
		got, err := os.ReadFile(filepath.Join(encodingsDir, name))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s/%s is missing or differs from the generator (%v); run go test -run TestEncodingCorpus -update", encodingsDir, name, err)
		}
	}
	entries, err := os.ReadDir(encodingsDir)
	if err != nil {
		t.Fatal(err)
	}
	cased := map[string]bool{"README.md": true, "ambiguous_windows-1252_or_gb18030.csv": true}
	for _, c := range encodingCases {
		cased[c.file] = true
	}
	for _, e := range entries {
		if !cased[e.Name()] {
			t.Errorf("%s/%s has no case in encodingCases", encodingsDir, e.Name())
		}
	}
}

// TestDetectEncoding reads each file of testdata/encodings and checks the encoding chosen, the header and the first
// record; where the bytes are valid in another encoding too, it checks that they are, so the case really tests
// plausibility.
func TestDetectEncoding(t *testing.T) {
	t.Parallel()
	for _, c := range encodingCases {
		t.Run(c.file+"/"+c.opts.Encoding, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(encodingsDir, c.file)
			r, err := Open(path, c.opts)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer r.Close()
			rec, err := r.Next()
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			got := []any{r.Encoding(), r.Header(), rec.Values}
			want := []any{c.encoding, c.header, c.first}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("[encoding, header, first record] (-want +got):\n%s", diff)
			}
			sum, err := Validate(path, c.opts)
			if err != nil || sum.Encoding != c.encoding {
				t.Errorf("Validate = %+v, %v; want encoding %s", sum, err, c.encoding)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, cand := range candidates() {
				if !slices.Contains(c.alsoValid, cand.name) {
					continue
				}
				v, err := weigh(f, cand)
				if err != nil {
					t.Fatal(err)
				}
				if v.bad >= 0 {
					t.Errorf("the file is not valid %s (byte 0x%02X at %d): the case does not test plausibility", cand.name, v.badByte, v.bad)
				}
			}
		})
	}
}

// TestAmbiguousEncoding: a file that reads plausibly in two encodings is rejected, naming both and how to choose.
func TestAmbiguousEncoding(t *testing.T) {
	t.Parallel()
	_, err := Validate(filepath.Join(encodingsDir, "ambiguous_windows-1252_or_gb18030.csv"), Options{})
	want := `ambiguous_windows-1252_or_gb18030.csv: the encoding is ambiguous: the text reads plausibly both as windows-1252 ("ÀÉ") and as gb18030 ("郎"); name the encoding (batchgen run --encoding windows-1252, or --encoding gb18030), or save the file as "CSV UTF-8"`
	if err == nil || err.Error() != want {
		t.Fatalf("Validate error = %v\nwant %s", err, want)
	}
	var ie *InputError
	var amb *AmbiguousEncodingError
	if !errors.As(err, &ie) || !errors.As(err, &amb) {
		t.Fatalf("error %T is not an *InputError wrapping an *AmbiguousEncodingError", err)
	}
	if diff := cmp.Diff([2]string{EncodingWindows1252, EncodingGB18030}, amb.Encodings); diff != "" {
		t.Errorf("Encodings (-want +got):\n%s", diff)
	}
}

// TestDetectEncodingOnLongText reads a few hundred rows of product copy in each legacy encoding: on long text the
// chance patterns (GBK pairs that happen to be valid UTF-8, Big5 pairs that are valid GBK) add up, and must not
// tip the choice.
func TestDetectEncodingOnLongText(t *testing.T) {
	t.Parallel()
	cases := []struct {
		enc  encoding.Encoding
		name string
		text string
	}{
		{simplifiedchinese.GBK, EncodingGB18030, "精选高原有机苹果，阳光充足、昼夜温差大，果肉脆甜多汁，每一口都是自然的味道。产地直发，新鲜到家。"},
		{traditionalchinese.Big5, EncodingBig5, "精選高原有機蘋果，陽光充足、晝夜溫差大，果肉脆甜多汁，每一口都是自然的味道。產地直送，新鮮到家。"},
		{japanese.ShiftJIS, EncodingShiftJIS, "高原で育った有機りんごです。日当たりがよく、昼と夜の寒暖差が大きいので、甘くてジューシーに育ちます。"},
		{charmap.Windows1252, EncodingWindows1252, "Pommes bio des hauts plateaux, gorgées de soleil : chair croquante et sucrée, expédiées du verger."},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			b.WriteString("id,text\n")
			for i := range 300 {
				b.WriteString(strconv.Itoa(i) + ",\"" + c.text[:len(c.text)-len(c.text)*(i%3)/10] + "\"\n")
			}
			data := excelBytes(t, c.enc, strings.ToValidUTF8(b.String(), ""))
			r, err := Open(writeFile(t, t.TempDir(), "long.csv", data), Options{})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer r.Close()
			if r.Encoding() != c.name {
				t.Errorf("Encoding = %s, want %s", r.Encoding(), c.name)
			}
		})
	}
}
