package sheet

import (
	"archive/zip"
	"bytes"
	"cmp"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// DateFormat is the number format of the date cells a result adds: ISO 8601, which every locale reads the same
// way and which reads back as the same text (Reader shows cells as Excel does).
const DateFormat = "yyyy-mm-dd"

// dateStyle is what adding date cells to a user's workbook takes: a cell style with DateFormat, added to the
// workbook's styles part, which is then the one part besides the input sheet (and the parts an added sheet
// declares itself in) that changes.
type dateStyle struct {
	part     string // the styles part
	content  []byte // its content with the style added
	index    int    // the style's index among the cell formats (a cell's s attribute)
	date1904 bool   // the workbook counts days from 1904 (Mac Excel's old default)
}

// errNoStyles says a workbook has no styles part to add a date style to: its dates are written as ISO text.
var errNoStyles = errors.New("the workbook has no styles part")

// addDateStyle prepares the styles part of the workbook in zr with a cell format for DateFormat appended: a number
// format (numFmtId one past the highest the part defines, and at least 164, where custom formats start) and a
// cellXfs entry that uses it. Everything else in the part keeps its bytes.
func addDateStyle(zr *zip.Reader) (*dateStyle, error) {
	wbPath := workbookPath(zr)
	relsPath := relsPathOf(wbPath)
	var rels struct {
		Rels []struct {
			Type   string `xml:"Type,attr"`
			Target string `xml:"Target,attr"`
		} `xml:"Relationship"`
	}
	if err := decodePart(zr, relsPath, &rels); err != nil {
		return nil, err
	}
	part := ""
	for _, r := range rels.Rels {
		if strings.HasSuffix(r.Type, "/styles") {
			part = relTarget(wbPath, r.Target)
		}
	}
	if part == "" {
		return nil, errNoStyles
	}
	var wb struct {
		Pr struct {
			Date1904 string `xml:"date1904,attr"`
		} `xml:"workbookPr"`
	}
	if err := decodePart(zr, wbPath, &wb); err != nil {
		return nil, err
	}
	rc, err := openPart(zr, part)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	content, err := io.ReadAll(io.LimitReader(rc, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", part, err)
	}
	edited, index, err := withDateStyle(content)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", part, err)
	}
	d1904 := wb.Pr.Date1904 == "1" || wb.Pr.Date1904 == "true"
	return &dateStyle{part: part, content: edited, index: index, date1904: d1904}, nil
}

func decodePart(zr *zip.Reader, name string, v any) error {
	rc, err := openPart(zr, name)
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := xml.NewDecoder(rc).Decode(v); err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	return nil
}

// withDateStyle returns a styles part with a DateFormat cell format appended, and that format's index.
func withDateStyle(content []byte) ([]byte, int, error) {
	type span struct{ from, to int } // a markup's bytes
	var (
		root, numFmtsOpen, numFmtsClose, xfsOpen, xfsClose span
		numFmts, xfs                                       markup
		numFmtCount, maxID, xfCount                        int
		depth, xfsDepth                                    int
		inNumFmts                                          bool
	)
	s := newXMLScanner(bytes.NewReader(content))
	for {
		raw, err := s.next(nil)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, 0, err
		}
		at := span{int(s.off) - len(raw), int(s.off)}
		m := parseMarkup(raw)
		if m.local == "" {
			continue
		}
		switch {
		case m.end:
			depth--
			if depth == 1 && m.local == "numFmts" {
				numFmtsClose, inNumFmts = at, false
			}
			if depth == 1 && m.local == "cellXfs" {
				xfsClose = at
			}
			continue
		case depth == 0:
			root = at
		case depth == 1 && m.local == "numFmts":
			numFmts, numFmtsOpen, inNumFmts = parseMarkup(bytes.Clone(raw)), at, !m.empty
			if m.empty {
				numFmtsClose = span{at.to, at.to}
			}
		case depth == 1 && m.local == "cellXfs":
			if m.empty {
				return nil, 0, errors.New("its list of cell formats is empty")
			}
			xfs, xfsOpen, xfsDepth = parseMarkup(bytes.Clone(raw)), at, depth+1
		case inNumFmts && m.local == "numFmt":
			numFmtCount++
			if v, ok := m.attr("numFmtId"); ok {
				if id, err := strconv.Atoi(v); err == nil {
					maxID = max(maxID, id)
				}
			}
		case depth == xfsDepth && xfsClose.to == 0 && m.local == "xf":
			xfCount++
		}
		if !m.empty {
			depth++
		}
	}
	if root.to == 0 || xfsOpen.to == 0 || xfsClose.to == 0 {
		return nil, 0, errors.New("no list of cell formats (cellXfs) found")
	}
	p := xfs.prefix
	id := max(maxID+1, 164)
	fmtTag := fmt.Sprintf(`<%snumFmt numFmtId="%d" formatCode="%s"/>`, p, id, DateFormat)
	xfTag := fmt.Sprintf(`<%sxf numFmtId="%d" fontId="0" fillId="0" borderId="0" xfId="0" applyNumberFormat="1"/>`, p, id)

	var out bytes.Buffer
	out.Grow(len(content) + 256)
	type edit struct {
		at   span
		with string
	}
	edits := []edit{
		{xfsClose, xfTag + string(content[xfsClose.from:xfsClose.to])},
		{xfsOpen, string(xfs.rebuild([][2]string{{"count", strconv.Itoa(xfCount + 1)}}))},
	}
	switch {
	case numFmtsOpen.to == 0:
		// No custom formats yet: the list goes first in the style sheet.
		edits = append(edits, edit{span{root.to, root.to}, fmt.Sprintf(`<%snumFmts count="1">%s</%snumFmts>`, p, fmtTag, p)})
	case numFmts.empty:
		edits = append(edits, edit{numFmtsOpen, fmt.Sprintf(`<%snumFmts count="1">%s</%snumFmts>`, numFmts.prefix, fmtTag, numFmts.prefix)})
	default:
		edits = append(edits,
			edit{numFmtsClose, fmtTag + string(content[numFmtsClose.from:numFmtsClose.to])},
			edit{numFmtsOpen, string(numFmts.rebuild([][2]string{{"count", strconv.Itoa(numFmtCount + 1)}}))})
	}
	// Apply in offset order; an insertion goes before a replacement that starts where it is (the list of formats
	// goes right after the root's tag, which cellXfs may follow at once).
	slices.SortFunc(edits, func(a, b edit) int { return cmp.Or(cmp.Compare(a.at.from, b.at.from), cmp.Compare(a.at.to, b.at.to)) })
	last := 0
	for _, e := range edits {
		out.Write(content[last:e.at.from])
		out.WriteString(e.with)
		last = e.at.to
	}
	out.Write(content[last:])
	return out.Bytes(), xfCount, nil
}
