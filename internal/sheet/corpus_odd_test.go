package sheet

import (
	"fmt"
	"html"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/text/transform"
)

const oddDir = "testdata/odd"

// cellStyle is one cellXfs entry of a hand-built style sheet.
type cellStyle struct {
	// numFmt is a built-in format id ("14") or a custom format code ("yyyy-mm-dd"); "" is General.
	numFmt string
	// border draws a thin border: a style Excel gives any formatted table cell, with the General number format.
	border bool
	// quotePrefix is what Excel records when a value is typed with a leading apostrophe ('00123).
	quotePrefix bool
}

// styleSheet renders the inner XML of xl/styles.xml: style index 0 is Excel's default, index i is styles[i-1].
// Custom formats get ids from 164 up, as Excel numbers them.
func styleSheet(styles ...cellStyle) string {
	var fmts, xfs strings.Builder
	nfmt := 0
	for i, s := range styles {
		id := s.numFmt
		if id == "" {
			id = "0"
		}
		if n, err := strconv.Atoi(id); err != nil || strconv.Itoa(n) != id { // "00000" is a code, not id 0
			id = strconv.Itoa(164 + i)
			nfmt++
			fmt.Fprintf(&fmts, `<numFmt numFmtId="%s" formatCode="%s"/>`, id, html.EscapeString(s.numFmt))
		}
		border := "0"
		if s.border {
			border = "1"
		}
		fmt.Fprintf(&xfs, `<xf numFmtId="%s" fontId="0" fillId="0" borderId="%s" xfId="0"`, id, border)
		if id != "0" {
			xfs.WriteString(` applyNumberFormat="1"`)
		}
		if s.quotePrefix {
			xfs.WriteString(` quotePrefix="1"`)
		}
		xfs.WriteString(`/>`)
	}
	var b strings.Builder
	if nfmt > 0 {
		fmt.Fprintf(&b, `<numFmts count="%d">%s</numFmts>`, nfmt, fmts.String())
	}
	b.WriteString(`<fonts count="1"><font><sz val="11"/><name val="等线"/></font></fonts>` +
		`<fills count="2"><fill><patternFill patternType="none"/></fill><fill><patternFill patternType="gray125"/></fill></fills>` +
		`<borders count="2"><border/><border><left style="thin"/><right style="thin"/><top style="thin"/><bottom style="thin"/></border></borders>` +
		`<cellStyleXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" borderId="0"/></cellStyleXfs>`)
	fmt.Fprintf(&b, `<cellXfs count="%d"><xf numFmtId="0" fontId="0" fillId="0" borderId="0" xfId="0"/>%s</cellXfs>`, len(styles)+1, xfs.String())
	return b.String()
}

// formatRow is one row of a number-format table: a label in column A and, in column B, a cell holding v with
// style s. typ is the cell type ("" number, "s" shared string index, "inlineStr", "b", "e", "d").
type formatRow struct {
	label string
	v     string
	typ   string
	style cellStyle
	want  string
}

// formatBook builds a two-column workbook ("格式", "值") from rows and returns it with the records it must read as.
func formatBook(t testing.TB, rows []formatRow, sst []string, date1904 bool) ([]byte, []Record) {
	t.Helper()
	var x strings.Builder
	x.WriteString(row(1, "格式", "值"))
	var styles []cellStyle
	var want []Record
	for i, r := range rows {
		n := i + 2
		s := 0
		if r.style != (cellStyle{}) {
			styles = append(styles, r.style)
			s = len(styles)
		}
		fmt.Fprintf(&x, `<row r="%d"><c r="A%d" t="inlineStr"><is><t>%s</t></is></c>`, n, n, html.EscapeString(r.label))
		switch r.typ {
		case "inlineStr":
			fmt.Fprintf(&x, `<c r="B%d" s="%d" t="inlineStr"><is><t>%s</t></is></c></row>`, n, s, html.EscapeString(r.v))
		case "":
			fmt.Fprintf(&x, `<c r="B%d" s="%d"><v>%s</v></c></row>`, n, s, r.v)
		default:
			fmt.Fprintf(&x, `<c r="B%d" s="%d" t="%s"><v>%s</v></c></row>`, n, s, r.typ, r.v)
		}
		want = append(want, rec(n, r.label, r.want))
	}
	return buildBook(t, testBook{sheets: []testSheet{{name: "格式", rows: x.String()}},
		styles: styleSheet(styles...), sst: sst, date1904: date1904}), want
}

// numberFormatRows are cells the way Excel stores them, each with what Excel shows (zh-CN for the
// locale-dependent built-in formats 14, 22 and 31; see shortDatePattern).
var numberFormatRows = []formatRow{
	{"短日期（内置 14）", "45306", "", cellStyle{numFmt: "14"}, "2024/1/15"},
	{"日期时间（内置 22）", "45306.5", "", cellStyle{numFmt: "22"}, "2024/1/15 12:00"},
	{"中文长日期（内置 31）", "45306", "", cellStyle{numFmt: "31"}, "2024年1月15日"},
	{"自定义 yyyy-mm-dd", "45306", "", cellStyle{numFmt: "yyyy-mm-dd"}, "2024-01-15"},
	{`自定义 yyyy"年"m"月"d"日"`, "45306", "", cellStyle{numFmt: `yyyy"年"m"月"d"日"`}, "2024年1月15日"},
	{"自定义 [$-F800] 长日期", "45306", "", cellStyle{numFmt: "[$-F800]dddd, mmmm dd, yyyy"}, "Monday, January 15, 2024"},
	{"时间 hh:mm:ss", "0.5", "", cellStyle{numFmt: "hh:mm:ss"}, "12:00:00"},
	{"时长 [h]:mm", "1.5", "", cellStyle{numFmt: "[h]:mm"}, "36:00"},
	{"百分比 0%", "0.125", "", cellStyle{numFmt: "0%"}, "13%"},
	{"百分比 0.00%（内置 10）", "0.125", "", cellStyle{numFmt: "10"}, "12.50%"},
	{"千分位（内置 4）", "1234.5", "", cellStyle{numFmt: "4"}, "1,234.50"},
	{"人民币", "-1234.5", "", cellStyle{numFmt: `"¥"#,##0.00`}, "-¥1,234.50"},
	{"美元会计，负数加括号", "-1234.5", "", cellStyle{numFmt: `$#,##0.00_);($#,##0.00)`}, "($1,234.50)"},
	{"欧元（德语区域）", "1234.5", "", cellStyle{numFmt: `[$€-407] #,##0.00`}, "€ 1,234.50"},
	{"分数 # ?/?", "1.75", "", cellStyle{numFmt: "# ?/?"}, "1 3/4"},
	{"分数（内置 12）", "1.75", "", cellStyle{numFmt: "12"}, "1 3/4"},
	{"科学计数 0.00E+00", "123456", "", cellStyle{numFmt: "0.00E+00"}, "1.23E+05"},
	{"前导零格式 00000", "123", "", cellStyle{numFmt: "00000"}, "00123"},
	{`单位 0.0" kg"`, "12.5", "", cellStyle{numFmt: `0.0" kg"`}, "12.5 kg"},
	{"文本格式 @ 的 00123", "0", "s", cellStyle{numFmt: "49"}, "00123"},
	{"引号前缀 '00123", "0", "s", cellStyle{quotePrefix: true}, "00123"},
	{"文本格式 @ 的 20 位整数", "1", "s", cellStyle{numFmt: "49"}, "12345678901234567890"},
	{"常规格式的 20 位整数文本", "12345678901234567890", "inlineStr", cellStyle{}, "12345678901234567890"},
	{"文本格式 @ 的数字", "45306", "", cellStyle{numFmt: "49"}, "45306"},
	{"常规格式条码（无样式）", "6901234567892", "", cellStyle{}, "6901234567892"},
	{"常规格式条码（带边框）", "6901234567892", "", cellStyle{border: true}, "6901234567892"},
	{"常规格式 20 位数字（带边框）", "12345678901234567890", "", cellStyle{border: true}, "1.23456789012346E+19"},
	{"数字格式 0 的 20 位数字", "12345678901234567890", "", cellStyle{numFmt: "1"}, "12345678901234600000"},
	{"常规格式浮点误差", "0.30000000000000004", "", cellStyle{border: true}, "0.3"},
	{"自定义代码 General", "123456789012", "", cellStyle{numFmt: "General"}, "123456789012"},
}

// date1904Rows are read from a workbook in the 1904 date system (Excel for Mac before 2011): the same serial
// numbers mean dates 1,462 days later.
var date1904Rows = []formatRow{
	{"自定义 yyyy-mm-dd", "45306", "", cellStyle{numFmt: "yyyy-mm-dd"}, "2028-01-16"},
	{"短日期（内置 14）", "45306", "", cellStyle{numFmt: "14"}, "2028/1/16"},
	{"1904 年后第 366 天", "366", "", cellStyle{numFmt: "yyyy-mm-dd"}, "1905-01-01"},
	{"时间 hh:mm", "0.75", "", cellStyle{numFmt: "hh:mm"}, "18:00"},
	{"常规格式的序号", "45306", "", cellStyle{}, "45306"},
}

// wideColumns is the width of the wide corpus files: well past what any real product sheet has, within Excel's
// 16,384.
const wideColumns = 10_000

func wideHeader() []string {
	h := make([]string, wideColumns)
	for i := range h {
		h[i] = "c" + strconv.Itoa(i+1)
	}
	return h
}

// wideXLSX is one header row and one data row of wideColumns cells each.
func wideXLSX(t testing.TB) []byte {
	var x strings.Builder
	x.WriteString(`<row r="1">`)
	for i, h := range wideHeader() {
		fmt.Fprintf(&x, `<c r="%s1" t="inlineStr"><is><t>%s</t></is></c>`, ColumnName(i+1), h)
	}
	x.WriteString(`</row><row r="2">`)
	for i := range wideColumns {
		fmt.Fprintf(&x, `<c r="%s2"><v>%d</v></c>`, ColumnName(i+1), i+1)
	}
	x.WriteString(`</row>`)
	return buildXLSX(t, testSheet{name: "宽表", rows: x.String()})
}

func wideXLSXWant() readResult {
	vals := make([]string, wideColumns)
	for i := range vals {
		vals[i] = strconv.Itoa(i + 1)
	}
	return readResult{Sheet: "宽表", Header: wideHeader(), Records: []Record{rec(2, vals...)}}
}

// wideCSV has values in its first, middle and last columns only, which keeps the file small.
func wideCSV() []byte {
	vals := make([]string, wideColumns)
	vals[0], vals[wideColumns/2-1], vals[wideColumns-1] = "first", "middle", "last"
	return []byte(strings.Join(wideHeader(), ",") + "\n" + strings.Join(vals, ",") + "\n")
}

func wideCSVWant() readResult {
	vals := make([]string, wideColumns)
	vals[0], vals[wideColumns/2-1], vals[wideColumns-1] = "first", "middle", "last"
	return readResult{Header: wideHeader(), Records: []Record{rec(2, vals...)}}
}

// longHeader is a 5,000-character header cell: accepted, because a header cell has the same limit as any other
// cell (MaxCellChars, 32,767 by default).
var longHeader = strings.Repeat("长", 5000)

// formulaRows: cached values of formulas, including references into another workbook through an external link.
// Nothing is evaluated and nothing is fetched: the link points at an address reserved for documentation.
const formulaRows = `<row r="1">` +
	`<c r="A1" t="inlineStr"><is><t>名称</t></is></c><c r="B1" t="inlineStr"><is><t>数量</t></is></c>` +
	`<c r="C1" t="inlineStr"><is><t>单价</t></is></c><c r="D1" t="inlineStr"><is><t>合计</t></is></c>` +
	`<c r="E1" t="inlineStr"><is><t>外部</t></is></c><c r="F1" t="inlineStr"><is><t>外部文本</t></is></c>` +
	`<c r="G1" t="inlineStr"><is><t>链接</t></is></c><c r="H1" t="inlineStr"><is><t>网络函数</t></is></c>` +
	`<c r="I1" t="inlineStr"><is><t>无缓存</t></is></c><c r="J1" t="inlineStr"><is><t>错误</t></is></c></row>` +
	`<row r="2"><c r="A2" t="inlineStr"><is><t>苹果</t></is></c><c r="B2"><v>2</v></c><c r="C2"><v>3</v></c>` +
	`<c r="D2"><f t="shared" ref="D2:D3" si="0">B2*C2</f><v>6</v></c>` +
	`<c r="E2"><f>[1]Sheet1!A1</f><v>42</v></c>` +
	`<c r="F2" t="str"><f>'[1]价格 表'!$B$2&amp;"元"</f><v>99元</v></c>` +
	`<c r="G2" t="str"><f>HYPERLINK("http://192.0.2.1/p/1","详情")</f><v>详情</v></c>` +
	`<c r="H2" t="str"><f>WEBSERVICE("http://192.0.2.1/price?id=1")</f><v>离线时的缓存</v></c>` +
	`<c r="I2"><f>B2*C2</f></c>` +
	`<c r="J2" t="e"><f>B2/0</f><v>#DIV/0!</v></c></row>` +
	`<row r="3"><c r="A3" t="inlineStr"><is><t>梨</t></is></c><c r="B3"><v>1</v></c><c r="C3"><v>5</v></c>` +
	`<c r="D3"><f t="shared" si="0"/><v>5</v></c>` +
	`<c r="E3"><f t="array" ref="E3">SUM(B2:B3*C2:C3)</f><v>11</v></c>` +
	`<c r="F3" t="b"><f>B3&gt;0</f><v>1</v></c>` +
	`<c r="G3" t="str"><f>"="&amp;"1+1"</f><v>=1+1</v></c>` +
	`<c r="H3" t="e"><f>[1]Sheet1!Z99+INDIRECT("[2]x!A1")</f><v>#REF!</v></c>` +
	`<c r="I3"><f>NOW()</f><v>45306.5</v></c>` +
	`<c r="J3" t="e"><f>VLOOKUP("x",A1:A2,2,FALSE)</f><v>#N/A</v></c></row>`

// externalLink is the part Excel writes for a workbook referenced as [1], with the values it last saw.
var externalLink = []zipEntry{
	{name: "xl/externalLinks/externalLink1.xml", data: []byte(`<?xml version="1.0" encoding="UTF-8" standalone="yes"?>` +
		`<externalLink xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" ` +
		`xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><externalBook r:id="rId1">` +
		`<sheetNames><sheetName val="Sheet1"/><sheetName val="价格 表"/></sheetNames><sheetDataSet>` +
		`<sheetData sheetId="0"><row r="1"><cell r="A1"><v>42</v></cell></row></sheetData>` +
		`<sheetData sheetId="1"><row r="2"><cell r="B2"><v>99</v></cell></row></sheetData>` +
		`</sheetDataSet></externalBook></externalLink>`)},
	{name: "xl/externalLinks/_rels/externalLink1.xml.rels", data: []byte(`<?xml version="1.0" encoding="UTF-8" standalone="yes"?>` +
		`<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">` +
		`<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/externalLinkPath" ` +
		`Target="http://192.0.2.1/share/prices.xlsx" TargetMode="External"/></Relationships>`)},
}

// oddCorpus generates every file under testdata/odd: inputs that are valid but unusual. Each must be read exactly
// as oddCases says, and internal/pipeline's round-trip test sends each through a whole job.
func oddCorpus(t testing.TB) map[string][]byte {
	t.Helper()
	numFmts, _ := formatBook(t, numberFormatRows, []string{`<t>00123</t>`, `<t>12345678901234567890</t>`}, false)
	dates1904, _ := formatBook(t, date1904Rows, nil, true)

	merged := row(1, "名称", "类目", "备注") + row(2, "苹果", "水果", "脆甜") +
		`<row r="3"><c r="A3" t="inlineStr"><is><t>以下几行有合并单元格</t></is></c><c r="B3"/><c r="C3"/></row>` +
		row(4, "香蕉", "水果") + row(5, "梨") + row(6, "橙", "", "多汁")

	sparse := row(1, "名称", "类目", "价格") + row(2, "苹果", "水果", "3") + row(3, "香蕉", "水果", "2") + row(4, "梨", "水果", "4") +
		`<row r="1048576" s="1" customFormat="1"><c r="A1048576" s="1"/><c r="B1048576" t="inlineStr"><is><t> </t></is></c></row>`

	richSST := []string{
		`<t>名称</t>`, `<t>描述</t>`,
		`<r><rPr><b/><sz val="11"/></rPr><t>红富士</t></r><r><rPr><i/><color rgb="FFFF0000"/></rPr><t xml:space="preserve"> 苹果 </t></r><r><t>（特级）</t></r>`,
		`<r><t>東京</t></r><rPh sb="0" eb="2"><t>トウキョウ</t></rPh><phoneticPr fontId="0" type="noConversion"/>`,
		`<t>制表_x0009_符</t>`, `<t>字面的 _x005F_x0041_</t>`, `<r><t></t></r><r><t>空的第一段</t></r>`,
	}
	rich := `<row r="1"><c r="A1" t="s"><v>0</v></c><c r="B1" t="s"><v>1</v></c><c r="C1" t="inlineStr"><is><t>内联</t></is></c></row>` +
		`<row r="2"><c r="A2" t="s"><v>2</v></c><c r="B2" t="s"><v>3</v></c>` +
		`<c r="C2" t="inlineStr"><is><r><rPr><b/></rPr><t>加粗</t></r><r><t xml:space="preserve"> 普通</t></r></is></c></row>` +
		`<row r="3"><c r="A3" t="s"><v>4</v></c><c r="B3" t="s"><v>5</v></c><c r="C3" t="s"><v>6</v></c></row>`

	typesSST := []string{`<t>共享文本</t>`, `<t>00123</t>`, `<t xml:space="preserve">  前后空格  </t>`}
	types := row(1, "内联字符串", "共享字符串", "布尔", "错误", "数字", "日期单元格") +
		`<row r="2"><c r="A2" t="inlineStr"><is><t>内联文本</t></is></c><c r="B2" t="s"><v>0</v></c><c r="C2" t="b"><v>1</v></c>` +
		`<c r="D2" t="e"><v>#DIV/0!</v></c><c r="E2"><v>3.14</v></c><c r="F2" s="1" t="d"><v>2024-01-15T00:00:00Z</v></c></row>` +
		`<row r="3"><c r="A3" t="inlineStr"><is><t xml:space="preserve">  内联 前后空格  </t></is></c><c r="B3" t="s"><v>1</v></c>` +
		`<c r="C3" t="b"><v>0</v></c><c r="D3" t="e"><v>#N/A</v></c><c r="E3"><v>-0.5</v></c>` +
		`<c r="F3" s="2" t="d"><v>2024-01-15T10:30:00</v></c></row>` +
		`<row r="4"><c r="A4" t="inlineStr"><is><t></t></is></c><c r="B4" t="s"><v>2</v></c><c r="C4" t="b"><f>1=1</f><v>1</v></c>` +
		`<c r="D4" t="e"><v>#VALUE!</v></c><c r="E4"><v>1E+22</v></c></row>` +
		`<row r="5"><c r="A5" t="inlineStr"><is><t>更多错误</t></is></c><c r="D5" t="e"><v>#REF!</v></c></row>` +
		`<row r="6"><c r="D6" t="e"><v>#NAME?</v></c></row><row r="7"><c r="D7" t="e"><v>#NUM!</v></c></row>` +
		`<row r="8"><c r="D8" t="e"><v>#NULL!</v></c></row><row r="9"><c r="D9" t="e"><v>#GETTING_DATA</v></c></row>`

	headerCells := []string{"  名称  ", "\n价格\n", "\t类目 ", "多行\n表头", "全角空格\u3000", "\u00a0不换行空格\u00a0"}
	quoted := make([]string, len(headerCells))
	for i, h := range headerCells {
		quoted[i] = `"` + h + `"` // none holds a quote
	}

	textValues := [][2]string{
		{"前导零", "00123"}, {"20 位整数", "12345678901234567890"}, {"像科学计数", "1e5"}, {"像公式", "=SUM(A1:A2)"},
		{"电话", "+86 138 0013 8000"}, {"负号开头", "-5"}, {"at 开头", "@提及"}, {"像布尔", "TRUE"}, {"像日期", "2024-01-15"},
		{"像分数", "1/2"}, {"全角数字", "３．１４"}, {"百分比", "50%"}, {"货币", "$1,234.50"}, {"单引号开头", "'00123"},
		{"引号", `"带引号"`}, {"像错误", "#N/A"}, {"前后空格", " 前后空格 "},
	}
	var tv strings.Builder
	tv.WriteString("说明,值\n")
	for _, v := range textValues {
		fmt.Fprintf(&tv, "%s,\"%s\"\n", v[0], strings.ReplaceAll(v[1], `"`, `""`))
	}

	// Excel stores characters XML cannot hold as _xHHHH_ (ECMA-376 ST_Xstring): a carriage return pasted from
	// Windows text is _x000D_, and the text "_x000D_" itself is _x005F_x000D_.
	escapesSST := []string{`<t>转义</t>`, "<t>第一行_x000D_\n第二行</t>", `<t>字面 _x005F_x000D_</t>`, `<t>小写_x000d_</t>`}
	escapes := `<row r="1"><c r="A1" t="s"><v>0</v></c><c r="B1" t="inlineStr"><is><t>内联</t></is></c>` +
		`<c r="C1" t="str"><f>"公式"</f><v>公式</v></c><c r="D1" t="inlineStr"><is><t>无坐标</t></is></c></row>` +
		`<row r="2"><c r="A2" t="s"><v>1</v></c><c r="B2" t="inlineStr"><is><t>制表_x0009_符 _x000D_</t></is></c>` +
		`<c r="C2" t="str"><f>"结果"&amp;CHAR(13)&amp;"换行"</f><v>结果_x000D_换行</v></c></row>` +
		`<row r="3"><c r="A3" t="s"><v>2</v></c><c r="B3" t="inlineStr"><is><r><t>字面 _x005F_</t></r><r><t>x000D_</t></r></is></c>` +
		`<c r="C3" t="str"><f>"字面 _x000D_"</f><v>字面 _x005F_x000D_</v></c></row>` +
		`<row r="4"><c r="A4" t="s"><v>3</v></c><c r="B4" t="inlineStr"><is><t>不是转义 _x12_ _xZZZZ_</t></is></c>` +
		`<c r="C4" t="str"><f>UNICHAR(128512)</f><v>_xD83D__xDE00_ 与孤立的 _xD83D_</v></c>` +
		`<c t="str"><f>"无 r 属性"</f><v>第四列_x000A_</v></c></row>`
	escapesPrompt := `<row r="1"><c r="A1" t="str"><f>"为{{转义}}写文案"&amp;CHAR(10)&amp;"要简短"</f><v>为{{转义}}写文案_x000A_要简短</v></c></row>`

	return map[string][]byte{
		"formulas.xlsx": buildBook(t, testBook{sheets: []testSheet{{name: "Sheet1", rows: formulaRows}},
			contentTypes: `<Override PartName="/xl/externalLinks/externalLink1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.externalLink+xml"/>`,
			rels:         `<Relationship Id="rIdExt1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/externalLink" Target="externalLinks/externalLink1.xml"/>`,
			workbookTail: `<externalReferences><externalReference r:id="rIdExt1"/></externalReferences>`,
			parts:        externalLink}),
		"wide_10000.xlsx": wideXLSX(t),
		"wide_10000.csv":  wideCSV(),
		"merged.xlsx": buildXLSX(t, testSheet{name: "Sheet1", rows: merged,
			after: `<mergeCells count="2"><mergeCell ref="A3:XFD3"/><mergeCell ref="B4:B6"/></mergeCells>`}),
		"hidden_sheets.xlsx": buildXLSX(t,
			testSheet{name: "旧数据", state: "hidden", rows: row(1, "名称", "旧价格") + row(2, "旧苹果", "1")},
			testSheet{name: "机密", state: "veryHidden", rows: row(1, "密钥") + row(2, "s3cr3t")},
			testSheet{name: "数据", rows: row(1, "名称", "价格") + row(2, "苹果", "3")},
			testSheet{name: "prompt", rows: row(1, "为{{名称}}写文案")}),
		"rich_text.xlsx":      buildBook(t, testBook{sheets: []testSheet{{name: "Sheet1", rows: rich}}, sst: richSST}),
		"number_formats.xlsx": numFmts,
		"escapes.xlsx": buildBook(t, testBook{sheets: []testSheet{{name: "Sheet1", rows: escapes}, {name: "prompt", rows: escapesPrompt}},
			sst: escapesSST}),
		"dates_1904.xlsx": dates1904,
		"sparse_1048576.xlsx": buildBook(t, testBook{sheets: []testSheet{{name: "Sheet1", rows: sparse,
			before: `<dimension ref="A1:C1048576"/>`}}, styles: styleSheet(cellStyle{border: true})}),
		"cell_types.xlsx": buildBook(t, testBook{sheets: []testSheet{{name: "Sheet1", rows: types}}, sst: typesSST,
			styles: styleSheet(cellStyle{numFmt: "14"}, cellStyle{numFmt: "yyyy-mm-dd hh:mm"})}),
		"header_spaces.xlsx": buildXLSX(t, testSheet{name: "Sheet1", rows: row(1, headerCells...) + row(2, "苹果", " 3 ", "水果", "x", "y", "z")}),
		"header_spaces.csv":  []byte(strings.Join(quoted, ",") + "\n苹果, 3 ,水果,x,y,z\n"),
		"header_case.csv":    []byte("Name,name,NAME,Ｎａｍｅ,ｎａｍｅ,ｶﾅ,カナ\n1,2,3,4,5,6,7\n"),
		"long_header.csv":    []byte(longHeader + ",短\n值,v\n"),
		"bom_crlf.csv":       []byte("\xEF\xBB\xBF名称,描述,编号\r\n苹果,\"多行\r\n描述\",00123\r\n\r\n香蕉,\"含\"\"引号\"\"\",12345678901234567890\r\n"),
		"lone_cr.csv":        []byte("名称,描述\r苹果,\"第一行\r第二行\"\r香蕉,黄\r"),
		"text_values.csv":    []byte(tv.String()),
	}
}

// oddCases are the expected reads of the odd corpus; a file may appear more than once with different options.
var oddCases = []struct {
	file string
	opts Options
	want func(t testing.TB) readResult
}{
	{"formulas.xlsx", Options{}, func(testing.TB) readResult {
		return readResult{Sheet: "Sheet1", Header: []string{"名称", "数量", "单价", "合计", "外部", "外部文本", "链接", "网络函数", "无缓存", "错误"},
			Records: []Record{
				// I2 holds B2*C2 without a cached result: computed, as Excel would show it once recalculated.
				rec(2, "苹果", "2", "3", "6", "42", "99元", "详情", "离线时的缓存", "6", "#DIV/0!"),
				rec(3, "梨", "1", "5", "5", "11", "TRUE", "=1+1", "#REF!", "45306.5", "#N/A"),
			}}
	}},
	{"wide_10000.xlsx", Options{}, func(testing.TB) readResult { return wideXLSXWant() }},
	{"wide_10000.csv", Options{}, func(testing.TB) readResult { return wideCSVWant() }},
	{"merged.xlsx", Options{}, func(testing.TB) readResult {
		return readResult{Sheet: "Sheet1", Header: []string{"名称", "类目", "备注"}, Records: []Record{
			rec(2, "苹果", "水果", "脆甜"), rec(3, "以下几行有合并单元格", "", ""), rec(4, "香蕉", "水果", ""), rec(5, "梨", "", ""), rec(6, "橙", "", "多汁"),
		}}
	}},
	{"hidden_sheets.xlsx", Options{}, func(testing.TB) readResult {
		return readResult{Sheet: "数据", Header: []string{"名称", "价格"}, Prompt: "为{{名称}}写文案", HasPrompt: true, Records: []Record{rec(2, "苹果", "3")}}
	}},
	{"hidden_sheets.xlsx", Options{Sheet: "旧数据"}, func(testing.TB) readResult {
		return readResult{Sheet: "旧数据", Header: []string{"名称", "旧价格"}, Prompt: "为{{名称}}写文案", HasPrompt: true, Records: []Record{rec(2, "旧苹果", "1")}}
	}},
	{"hidden_sheets.xlsx", Options{Sheet: "机密"}, func(testing.TB) readResult {
		return readResult{Sheet: "机密", Header: []string{"密钥"}, Prompt: "为{{名称}}写文案", HasPrompt: true, Records: []Record{rec(2, "s3cr3t")}}
	}},
	{"rich_text.xlsx", Options{}, func(testing.TB) readResult {
		return readResult{Sheet: "Sheet1", Header: []string{"名称", "描述", "内联"}, Records: []Record{
			rec(2, "红富士 苹果 （特级）", "東京", "加粗 普通"), rec(3, "制表\t符", "字面的 _x0041_", "空的第一段"),
		}}
	}},
	{"escapes.xlsx", Options{}, func(testing.TB) readResult {
		return readResult{Sheet: "Sheet1", Header: []string{"转义", "内联", "公式", "无坐标"}, Prompt: "为{{转义}}写文案\n要简短", HasPrompt: true,
			Records: []Record{
				rec(2, "第一行\r\n第二行", "制表\t符 \r", "结果\r换行", ""),
				rec(3, "字面 _x000D_", "字面 _x000D_", "字面 _x000D_", ""),
				rec(4, "小写\r", "不是转义 _x12_ _xZZZZ_", "😀 与孤立的 \uFFFD", "第四列\n"),
			}}
	}},
	{"number_formats.xlsx", Options{}, func(t testing.TB) readResult {
		_, want := formatBook(t, numberFormatRows, nil, false)
		return readResult{Sheet: "格式", Header: []string{"格式", "值"}, Records: want}
	}},
	{"dates_1904.xlsx", Options{}, func(t testing.TB) readResult {
		_, want := formatBook(t, date1904Rows, nil, true)
		return readResult{Sheet: "格式", Header: []string{"格式", "值"}, Records: want}
	}},
	{"sparse_1048576.xlsx", Options{}, func(testing.TB) readResult {
		return readResult{Sheet: "Sheet1", Header: []string{"名称", "类目", "价格"}, Records: []Record{
			rec(2, "苹果", "水果", "3"), rec(3, "香蕉", "水果", "2"), rec(4, "梨", "水果", "4"),
		}}
	}},
	{"cell_types.xlsx", Options{}, func(testing.TB) readResult {
		return readResult{Sheet: "Sheet1", Header: []string{"内联字符串", "共享字符串", "布尔", "错误", "数字", "日期单元格"}, Records: []Record{
			rec(2, "内联文本", "共享文本", "TRUE", "#DIV/0!", "3.14", "2024/1/15"),
			rec(3, "  内联 前后空格  ", "00123", "FALSE", "#N/A", "-0.5", "2024-01-15T10:30:00"), // no zone: excelize leaves it as is
			rec(4, "", "  前后空格  ", "TRUE", "#VALUE!", "1E+22", ""),
			rec(5, "更多错误", "", "", "#REF!", "", ""),
			rec(6, "", "", "", "#NAME?", "", ""),
			rec(7, "", "", "", "#NUM!", "", ""),
			rec(8, "", "", "", "#NULL!", "", ""),
			rec(9, "", "", "", "#GETTING_DATA", "", ""),
		}}
	}},
	{"header_spaces.xlsx", Options{}, func(testing.TB) readResult {
		return readResult{Sheet: "Sheet1", Header: []string{"名称", "价格", "类目", "多行\n表头", "全角空格", "不换行空格"},
			Records: []Record{rec(2, "苹果", " 3 ", "水果", "x", "y", "z")}}
	}},
	{"header_spaces.csv", Options{}, func(testing.TB) readResult {
		return readResult{Header: []string{"名称", "价格", "类目", "多行\n表头", "全角空格", "不换行空格"},
			Records: []Record{rec(2, "苹果", " 3 ", "水果", "x", "y", "z")}}
	}},
	{"header_case.csv", Options{}, func(testing.TB) readResult {
		return readResult{Header: []string{"Name", "name", "NAME", "Ｎａｍｅ", "ｎａｍｅ", "ｶﾅ", "カナ"},
			Records: []Record{rec(2, "1", "2", "3", "4", "5", "6", "7")}}
	}},
	{"long_header.csv", Options{}, func(testing.TB) readResult {
		return readResult{Header: []string{longHeader, "短"}, Records: []Record{rec(2, "值", "v")}}
	}},
	{"long_header.csv", Options{Limits: Limits{MaxCellChars: 5000}}, func(testing.TB) readResult {
		return readResult{Header: []string{longHeader, "短"}, Records: []Record{rec(2, "值", "v")}}
	}},
	{"bom_crlf.csv", Options{}, func(testing.TB) readResult {
		return readResult{Header: []string{"名称", "描述", "编号"}, Records: []Record{
			rec(2, "苹果", "多行\n描述", "00123"), blank(3, 3), rec(4, "香蕉", `含"引号"`, "12345678901234567890"),
		}}
	}},
	{"lone_cr.csv", Options{}, func(testing.TB) readResult {
		return readResult{Header: []string{"名称", "描述"}, Records: []Record{rec(2, "苹果", "第一行\n第二行"), rec(3, "香蕉", "黄")}}
	}},
	{"text_values.csv", Options{}, func(testing.TB) readResult {
		return readResult{Header: []string{"说明", "值"}, Records: []Record{
			rec(2, "前导零", "00123"), rec(3, "20 位整数", "12345678901234567890"), rec(4, "像科学计数", "1e5"),
			rec(5, "像公式", "=SUM(A1:A2)"), rec(6, "电话", "+86 138 0013 8000"), rec(7, "负号开头", "-5"), rec(8, "at 开头", "@提及"),
			rec(9, "像布尔", "TRUE"), rec(10, "像日期", "2024-01-15"), rec(11, "像分数", "1/2"), rec(12, "全角数字", "３．１４"),
			rec(13, "百分比", "50%"), rec(14, "货币", "$1,234.50"), rec(15, "单引号开头", "'00123"), rec(16, "引号", `"带引号"`),
			rec(17, "像错误", "#N/A"), rec(18, "前后空格", " 前后空格 "),
		}}
	}},
}

// TestOddInputs reads every odd file and checks exactly what comes back, through Open/Next and through Validate.
func TestOddInputs(t *testing.T) {
	t.Parallel()
	for _, c := range oddCases {
		name := c.file
		if c.opts.Sheet != "" {
			name += "/sheet=" + c.opts.Sheet
		}
		if c.opts.Limits != (Limits{}) {
			name += fmt.Sprintf("/limits=%+v", c.opts.Limits)
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			want := c.want(t).withEncoding(strings.EqualFold(filepath.Ext(c.file), ".csv"))
			path := filepath.Join(oddDir, c.file)
			r, err := Open(path, c.opts)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer r.Close()
			got := readResult{Sheet: r.Sheet(), Header: r.Header(), Encoding: r.Encoding(), Delimiter: r.Delimiter()}
			got.Prompt, got.HasPrompt = r.Prompt()
			got.Records = readAll(t, r)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("read (-want +got):\n%s", diff)
			}
			sum, err := Validate(path, c.opts)
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			wantSum := want.summary()
			if c.file == "formulas.xlsx" { // I2, the one formula without a cached result, computed
				wantSum.Uncached = []UncachedColumn{{Column: 9, Computed: 1}}
			}
			if diff := cmp.Diff(wantSum, sum); diff != "" {
				t.Errorf("Validate (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSparseSheetSkipsEmptyRowsWithoutWork reads a sheet whose last row is 1,048,576 but which has 3 data rows. The
// row iterator visits every row number in between; counting allocations (not time, which is noisy) shows each
// empty one costs nothing: before, each allocated a record, a million allocations per read.
func TestSparseSheetSkipsEmptyRowsWithoutWork(t *testing.T) {
	path := filepath.Join(oddDir, "sparse_1048576.xlsx")
	dense := writeFile(t, t.TempDir(), "dense.xlsx", buildBook(t, testBook{sheets: []testSheet{{name: "Sheet1",
		rows: row(1, "名称", "类目", "价格") + row(2, "苹果", "水果", "3") + row(3, "香蕉", "水果", "2") + row(4, "梨", "水果", "4")}},
		styles: styleSheet(cellStyle{border: true})}))
	allocs := func(p string) float64 {
		return testing.AllocsPerRun(3, func() {
			if sum, err := Validate(p, Options{}); err != nil || sum.Rows != 3 {
				t.Fatalf("Validate = %+v, %v; want 3 rows", sum, err)
			}
		})
	}
	if sparse, base := allocs(path), allocs(dense); sparse > base+1000 {
		t.Errorf("reading the sparse sheet made %.0f allocations, the same sheet without row 1,048,576 %.0f: empty rows are not free", sparse, base)
	}
}

// BenchmarkWideSheetRoundTrip reads and writes a sheet of two rows and 2,500 or 10,000 columns. Linear work
// takes about 4 times as long for the wider sheet, quadratic work 16 times: make bench holds the ratio to 10
// (cmd/batchgen-bench, "wide-sheet"). Writing 10,000 columns used to take minutes (see sizedColumns;
// TestWriterSizesAtMostSizedColumns holds the cause).
func BenchmarkWideSheetRoundTrip(b *testing.B) {
	const rows = 2
	for _, n := range []int{2500, 10_000} {
		var x strings.Builder
		for r := 1; r <= rows+1; r++ {
			fmt.Fprintf(&x, `<row r="%d">`, r)
			for c := 1; c <= n; c++ {
				fmt.Fprintf(&x, `<c r="%s%d" t="inlineStr"><is><t>r%dc%d</t></is></c>`, ColumnName(c), r, r, c)
			}
			x.WriteString(`</row>`)
		}
		path := writeFile(b, b.TempDir(), fmt.Sprintf("w%d.xlsx", n), buildXLSX(b, testSheet{name: "宽表", rows: x.String()}))
		b.Run(fmt.Sprintf("columns=%d", n), func(b *testing.B) {
			for b.Loop() {
				r, err := Open(path, Options{})
				if err != nil {
					b.Fatal(err)
				}
				recs := readAll(b, r)
				if err := r.Close(); err != nil {
					b.Fatal(err)
				}
				w, err := NewWriter("宽表", r.Header())
				if err != nil {
					b.Fatal(err)
				}
				for _, rec := range recs {
					if err := w.WriteRow(rec.Values); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := w.WriteTo(io.Discard); err != nil {
					b.Fatal(err)
				}
				if err := w.Close(); err != nil {
					b.Fatal(err)
				}
				if len(recs) != rows || len(r.Header()) != n {
					b.Fatalf("read %d rows of %d columns, want %d of %d", len(recs), len(r.Header()), rows, n)
				}
			}
		})
	}
}

// TestWriterSizesAtMostSizedColumns checks the export of a wide sheet gives explicit widths to the first
// sizedColumns columns only: excelize scans every sized column for every cell written.
func TestWriterSizesAtMostSizedColumns(t *testing.T) {
	t.Parallel()
	h := wideHeader()
	data := writeWorkbook(t, "宽表", h, [][]string{h})
	if n := strings.Count(sheetXML(t, data), "<col "); n != sizedColumns {
		t.Errorf("%d <col> entries for %d columns, want %d", n, len(h), sizedColumns)
	}
	f := openBook(t, data)
	if got, err := f.GetCellValue("宽表", ColumnName(wideColumns)+"2"); err != nil || got != h[wideColumns-1] {
		t.Errorf("last cell = %q, %v; want %q", got, err, h[wideColumns-1])
	}
}

// TestLoneCRToLF checks the line-ending translation on its own, including a CRLF split across two reads, which
// must stay one line break.
func TestLoneCRToLF(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, in, want string }{
		{"lone CR", "a\rb\r", "a\nb\n"},
		{"CRLF untouched", "a\r\nb\r\n", "a\r\nb\r\n"},
		{"LF untouched", "a\nb\n", "a\nb\n"},
		{"mixed", "a\r\r\nb\n\rc", "a\n\r\nb\n\nc"},
		{"CR at the end", "a\r", "a\n"},
		{"no line ends", "abc", "abc"},
	}
	for _, c := range cases {
		for _, oneByte := range []bool{false, true} {
			var src io.Reader = strings.NewReader(c.in)
			if oneByte {
				src = iotest.OneByteReader(src)
			}
			got, err := io.ReadAll(transform.NewReader(src, loneCRToLF{}))
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if diff := cmp.Diff(c.want, string(got)); diff != "" {
				t.Errorf("%s (one byte per read: %v) (-want +got):\n%s", c.name, oneByte, diff)
			}
		}
	}
}
