package web

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path"
	"strings"
	"unicode"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// Inspection is the 200 body of POST /ui/inspect: what the page needs to
// offer the columns as placeholders and preview the first prompt.
type Inspection struct {
	// Filename is the uploaded file's name as the messages show it.
	Filename string `json:"filename"`
	// Sheet is the worksheet read; empty for CSV/TSV.
	Sheet string `json:"sheet,omitempty"`
	// Encoding is the text encoding a CSV/TSV was read with; empty for xlsx.
	Encoding string `json:"encoding,omitempty"`
	// Columns are the trimmed header texts, in sheet order: the names
	// {{placeholders}} match.
	Columns []string `json:"columns"`
	// Rows counts the data rows the job would run (blank rows included).
	Rows int `json:"rows"`
	// Sample holds the first non-blank data rows, one value per column.
	Sample [][]string `json:"sample"`
	// Prompt is the workbook's own template (cell A1 of its "prompt"
	// sheet), when it has one.
	Prompt string `json:"prompt,omitempty"`
	// OutputColumns are the answer columns the workbook declares (a table
	// below the template on its prompt sheet), for the page to show and
	// edit; absent when it declares none or the table is wrong (the
	// upload then says what is wrong).
	OutputColumns schema.Columns `json:"output_columns,omitempty"`
	// Rerun, for a result sent back in (recognised by the result columns
	// it ends with; Columns then lists only the input's), says what its
	// rows would become with the workbook's own template: kept, or run
	// again. Absent for any other sheet, and for a partial one.
	Rerun *pipeline.RerunCounts `json:"rerun,omitempty"`
	// Partial is set when the request sent only the head of a sheet
	// (the form field "partial" set to "head"): Rows then counts only
	// the rows read for the samples, and the whole sheet is checked when
	// it is uploaded.
	Partial bool `json:"partial,omitempty"`
}

type inspector struct{ cfg Config }

// multipartSlack is what a multipart body may carry beyond the file: the
// boundaries, part headers and the small text fields.
const multipartSlack = 64 << 10

func (in *inspector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if in.cfg.Authenticate != nil {
		if err := in.cfg.Authenticate(r); err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="batchgen"`)
			api.WriteError(w, http.StatusUnauthorized, "unauthorized", "a valid bearer token is required")
			return
		}
	}
	limit := in.cfg.Limits.MaxFileBytes
	r.Body = http.MaxBytesReader(w, r.Body, limit+multipartSlack)
	mr, err := r.MultipartReader()
	if err != nil {
		api.WriteError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "send the sheet as multipart/form-data with the file in the field \"file\"")
		return
	}
	spool, err := os.CreateTemp(in.cfg.TempDir, "batchgen-inspect-*")
	if err != nil {
		in.internal(w, "create spool file", err)
		return
	}
	defer os.Remove(spool.Name())
	defer spool.Close()

	var opts sheet.Options
	opts.Limits = sheet.Limits{MaxRows: in.cfg.Limits.MaxRows, MaxFileBytes: in.cfg.Limits.MaxFileBytes}
	var name string
	partial := false
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			in.bodyError(w, err, limit)
			return
		}
		switch p.FormName() {
		case "file":
			if name != "" {
				api.WriteError(w, http.StatusBadRequest, "invalid_request", "send one file per request")
				return
			}
			name = displayName(p.FileName())
			// One byte past the limit is enough to know it is too big.
			n, err := io.Copy(spool, io.LimitReader(p, limit+1))
			if err != nil {
				in.bodyError(w, err, limit)
				return
			}
			if n > limit {
				api.WriteError(w, http.StatusRequestEntityTooLarge, "file_too_large",
					fmt.Sprintf("%s is larger than %s, the largest sheet this server accepts", name, mib(limit)))
				return
			}
		case "encoding", "sheet", "partial":
			v, err := formValue(p)
			if err != nil {
				in.bodyError(w, err, limit)
				return
			}
			switch p.FormName() {
			case "encoding":
				opts.Encoding = v
			case "sheet":
				opts.Sheet = v
			default:
				if v != "head" {
					api.WriteError(w, http.StatusBadRequest, "invalid_request", `field "partial" takes one value, "head": the file is the first bytes of a larger CSV/TSV`)
					return
				}
				partial = true
			}
		}
	}
	if name == "" {
		api.WriteError(w, http.StatusBadRequest, "invalid_request", "no file: send the sheet in the multipart field \"file\"")
		return
	}
	if partial {
		// A head is cut wherever the page cut it, likely inside a line or
		// a character; whole lines are what it has to say.
		if err := trimToLastLine(spool); err != nil {
			in.internal(w, "trim partial upload", err)
			return
		}
	}
	if err := spool.Close(); err != nil {
		in.internal(w, "spool upload", err)
		return
	}
	opts.DisplayName = name
	ins, err := inspect(spool.Name(), opts, in.cfg.SampleRows, partial)
	var bad *sheet.InputError
	switch {
	case errors.As(err, &bad):
		api.WriteError(w, http.StatusBadRequest, "invalid_sheet", bad.Error())
		return
	case err != nil:
		in.internal(w, "inspect sheet", err)
		return
	}
	api.WriteJSON(w, http.StatusOK, ins)
}

// inspect reads the whole sheet, as the splitter will, so a problem in row
// 4,000 shows before the task is created, and keeps the first sample rows.
// A partial file (the head of a larger one) is read only as far as the
// samples: its last line is likely cut in the middle, which says nothing
// of the sheet.
func inspect(file string, opts sheet.Options, samples int, partial bool) (Inspection, error) {
	r, err := sheet.Open(file, opts)
	if err != nil {
		return Inspection{}, err
	}
	defer r.Close()
	ins := Inspection{Filename: opts.DisplayName, Sheet: r.Sheet(), Encoding: r.Encoding(), Columns: r.Header(), Sample: [][]string{}, Partial: partial}
	if p, ok := r.Prompt(); ok {
		ins.Prompt = p
	}
	if cols, err := schema.ParseTable(r.PromptRows(), 2); err == nil {
		ins.OutputColumns = cols
	}
	for !partial || len(ins.Sample) < samples {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return ins, rerun(file, opts, &ins)
		}
		if err != nil {
			return Inspection{}, err
		}
		ins.Rows++
		if !rec.Blank && len(ins.Sample) < samples {
			ins.Sample = append(ins.Sample, rec.Values)
		}
	}
	return ins, nil
}

// rerun fills in what a result sent back in would do, with its own
// template, and narrows its columns to the input's: a placeholder never
// names an answer. The full sheet was read already; this reads it again,
// for results only.
func rerun(file string, opts sheet.Options, ins *Inspection) error {
	input := pipeline.InputColumns(ins.Columns, ins.OutputColumns)
	if len(input) == len(ins.Columns) || ins.Prompt == "" {
		ins.Columns = input
		return nil
	}
	ins.Columns = input
	for i, row := range ins.Sample {
		ins.Sample[i] = row[:min(len(row), len(input))]
	}
	v, err := pipeline.Validate(pipeline.SplitParams{Path: file, Source: opts.DisplayName, Sheet: opts.Sheet, Encoding: opts.Encoding,
		Limits: opts.Limits, Spec: store.TaskSpec{Prompt: ins.Prompt, Columns: ins.OutputColumns}})
	if err != nil {
		return nil // the template is the user's to fix on the page; the upload says what is wrong
	}
	ins.Rerun = v.Rerun
	return nil
}

// trimToLastLine cuts f after its last line feed, found by reading back
// from the end a block at a time. A file without one is left whole: its
// one line may be the header, and the reader says what is wrong with it.
// A line feed byte is never part of a multi-byte character in UTF-8 or
// GB18030, so the cut never splits one.
func trimToLastLine(f *os.File) error {
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("size of %s: %w", f.Name(), err)
	}
	buf := make([]byte, 64<<10)
	for pos := end; pos > 0; {
		n := min(int64(len(buf)), pos)
		pos -= n
		if _, err := f.ReadAt(buf[:n], pos); err != nil {
			return fmt.Errorf("read %s: %w", f.Name(), err)
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			if err := f.Truncate(pos + int64(i) + 1); err != nil {
				return fmt.Errorf("truncate %s: %w", f.Name(), err)
			}
			return nil
		}
	}
	return nil
}

// maxFieldBytes bounds a text field of the form.
const maxFieldBytes = 256

func formValue(p *multipart.Part) (string, error) {
	b, err := io.ReadAll(io.LimitReader(p, maxFieldBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxFieldBytes {
		return "", fmt.Errorf("field %q is longer than %d bytes", p.FormName(), maxFieldBytes)
	}
	return strings.TrimSpace(string(b)), nil
}

// bodyError answers a failure to read the request body: too large, or a
// malformed form (whose message is about the client's own bytes).
func (in *inspector) bodyError(w http.ResponseWriter, err error, limit int64) {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		api.WriteError(w, http.StatusRequestEntityTooLarge, "file_too_large",
			fmt.Sprintf("the upload is larger than %s, the largest sheet this server accepts", mib(limit)))
		return
	}
	api.WriteError(w, http.StatusBadRequest, "invalid_request", "the form could not be read: "+err.Error())
}

func (in *inspector) internal(w http.ResponseWriter, what string, err error) {
	in.cfg.Logger.Error("web: "+what, "error", err)
	api.WriteError(w, http.StatusInternalServerError, "internal", "internal error")
}

// displayName is the upload's base name without control characters, for
// messages only: nothing is stored under it.
func displayName(name string) string {
	name = strings.ReplaceAll(name, `\`, "/")
	name = path.Base(name)
	name = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, name)
	if name == "." || name == "/" || strings.TrimSpace(name) == "" {
		return "upload"
	}
	if len(name) > 255 {
		name = strings.ToValidUTF8(name[:255], "")
	}
	return name
}

func mib(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}
