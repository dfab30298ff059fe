package sheet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"unicode/utf16"
)

// kind is what the first bytes of a file say it is.
type kind int

const (
	kindText kind = iota // candidate CSV/TSV; the encoding is checked later
	kindZip
	kindOLE2
	kindPDF
	kindPNG
	kindJPEG
	kindGIF
	kindGzip
	kind7z
	kindRAR
	kindELF
	kindRTF
	kindHTML
	kindXMLSpreadsheet
	kindXML
)

// magics maps leading bytes to kinds. Text-like formats (HTML, XML) are matched separately, after white space and
// a byte-order mark.
var magics = []struct {
	prefix string
	kind   kind
}{
	{"PK\x03\x04", kindZip},
	{"PK\x05\x06", kindZip}, // empty archive
	{"\xD0\xCF\x11\xE0\xA1\xB1\x1A\xE1", kindOLE2},
	{"%PDF-", kindPDF},
	{"\x89PNG\r\n\x1A\n", kindPNG},
	{"\xFF\xD8\xFF", kindJPEG},
	{"GIF87a", kindGIF},
	{"GIF89a", kindGIF},
	{"\x1F\x8B", kindGzip},
	{"7z\xBC\xAF\x27\x1C", kind7z},
	{"Rar!\x1A\x07", kindRAR},
	{"\x7FELF", kindELF},
	{"{\\rtf", kindRTF},
}

// sniff classifies a file from its first bytes (up to 512).
func sniff(head []byte) kind {
	for _, m := range magics {
		if bytes.HasPrefix(head, []byte(m.prefix)) {
			return m.kind
		}
	}
	t := bytes.TrimPrefix(head, []byte("\xEF\xBB\xBF"))
	t = bytes.TrimLeft(t, " \t\r\n")
	lower := bytes.ToLower(t)
	switch {
	case bytes.HasPrefix(lower, []byte("<!doctype html")), bytes.HasPrefix(lower, []byte("<html")):
		return kindHTML
	case bytes.HasPrefix(lower, []byte("<?xml")):
		if bytes.Contains(lower, []byte("excel.sheet")) || bytes.Contains(lower, []byte("urn:schemas-microsoft-com:office:spreadsheet")) {
			return kindXMLSpreadsheet
		}
		if bytes.Contains(lower, []byte("<html")) {
			return kindHTML
		}
		return kindXML
	}
	return kindText
}

// reason is the rejection message for kinds that are not spreadsheets we read.
func (k kind) reason() string {
	const not = ", not a spreadsheet"
	switch k {
	case kindPDF:
		return "looks like a PDF" + not
	case kindPNG:
		return "looks like a PNG image" + not
	case kindJPEG:
		return "looks like a JPEG image" + not
	case kindGIF:
		return "looks like a GIF image" + not
	case kindGzip:
		return "looks like a gzip archive" + not
	case kind7z:
		return "looks like a 7-Zip archive" + not
	case kindRAR:
		return "looks like a RAR archive" + not
	case kindELF:
		return "looks like a program (ELF executable)" + not
	case kindRTF:
		return "looks like an RTF document" + not
	case kindHTML:
		return "looks like an HTML page" + not + " (some systems export HTML tables named .xls); open it in Excel and save it as .xlsx"
	case kindXMLSpreadsheet:
		return "XML Spreadsheet 2003 is not supported; open it in Excel and save it as .xlsx"
	case kindXML:
		return "looks like an XML document" + not
	default:
		return "is not a supported spreadsheet"
	}
}

// OLE2 directory entry names are UTF-16LE; an encrypted OOXML package stores the real workbook in these streams.
var encryptedStreams = [][]byte{utf16LE("EncryptedPackage"), utf16LE("EncryptionInfo")}

func utf16LE(s string) []byte {
	u := utf16.Encode([]rune(s))
	b := make([]byte, 0, 2*len(u))
	for _, c := range u {
		b = append(b, byte(c), byte(c>>8))
	}
	return b
}

// ole2Error tells a password-protected xlsx (an OLE2 container holding an EncryptedPackage) from a legacy .xls.
// The directory can sit anywhere in the container, so the whole file (already capped by MaxFileBytes) is scanned
// in chunks that overlap by the length of the longest name.
func (r *Reader) ole2Error(f *os.File) error {
	const overlap = 64
	buf := make([]byte, 64<<10)
	var off int64
	for {
		n, err := f.ReadAt(buf, off)
		for _, name := range encryptedStreams {
			if bytes.Contains(buf[:n], name) {
				return r.formatErr("the workbook is password-protected; remove the password and save again")
			}
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read spreadsheet %q: %w", r.file, err)
		}
		if err != nil || n < len(buf) {
			break
		}
		off += int64(n - overlap)
	}
	return r.formatErr("legacy .xls (Excel 97-2003) is not supported; save it as .xlsx")
}
