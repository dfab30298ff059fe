package pipeline

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/batchgen/batchgen/internal/sheet"
)

// The records Validate reads are spooled to a temporary file for Split, so
// that a sheet is opened and decoded once: decoding an xlsx (its zip, its
// XML, its shared strings) is most of a split's CPU, and reading the spool
// back costs a fraction of it. The format is private to one process: per
// record, uvarint sheet row, a blank byte, uvarint value count, then each
// value as uvarint length and bytes.

// spoolWriter writes records to a spool file.
type spoolWriter struct {
	f   *os.File
	w   *bufio.Writer
	buf []byte
}

func newSpool(dir string) (*spoolWriter, error) {
	f, err := os.CreateTemp(dir, "batchgen-rows-*.spool")
	if err != nil {
		return nil, fmt.Errorf("spool the rows: %w", err)
	}
	return &spoolWriter{f: f, w: bufio.NewWriterSize(f, 256<<10)}, nil
}

func (s *spoolWriter) write(rec sheet.Record) error {
	b := s.buf[:0]
	b = binary.AppendUvarint(b, uint64(rec.SheetRow))
	if rec.Blank {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(rec.Values)))
	for _, v := range rec.Values {
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	s.buf = b
	_, err := s.w.Write(b)
	return err
}

// finish flushes and closes the file, returning its path; on error the file
// is removed.
func (s *spoolWriter) finish() (string, error) {
	err := errors.Join(s.w.Flush(), s.f.Close())
	if err != nil {
		os.Remove(s.f.Name())
		return "", fmt.Errorf("spool the rows: %w", err)
	}
	return s.f.Name(), nil
}

// discard removes a spool that will not be used.
func (s *spoolWriter) discard() {
	s.f.Close()
	os.Remove(s.f.Name())
}

// spoolReader reads the records of a spool back, as a sheet.Reader returns
// them.
type spoolReader struct {
	f *os.File
	r *bufio.Reader
}

func openSpool(path string) (*spoolReader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read the spooled rows: %w", err)
	}
	return &spoolReader{f: f, r: bufio.NewReaderSize(f, 256<<10)}, nil
}

// Next returns the next record, or io.EOF after the last.
func (s *spoolReader) Next() (sheet.Record, error) {
	row, err := binary.ReadUvarint(s.r)
	if errors.Is(err, io.EOF) {
		return sheet.Record{}, io.EOF
	}
	if err != nil {
		return sheet.Record{}, s.damaged(err)
	}
	blank, err := s.r.ReadByte()
	if err != nil {
		return sheet.Record{}, s.damaged(err)
	}
	n, err := binary.ReadUvarint(s.r)
	if err != nil || n > sheet.DefaultMaxColumns {
		return sheet.Record{}, s.damaged(err)
	}
	rec := sheet.Record{SheetRow: int(row), Blank: blank == 1, Values: make([]string, n)}
	for i := range rec.Values {
		size, err := binary.ReadUvarint(s.r)
		if err != nil || size > 1<<30 {
			return sheet.Record{}, s.damaged(err)
		}
		b := make([]byte, size)
		if _, err := io.ReadFull(s.r, b); err != nil {
			return sheet.Record{}, s.damaged(err)
		}
		rec.Values[i] = string(b)
	}
	return rec, nil
}

func (s *spoolReader) damaged(err error) error {
	return fmt.Errorf("read the spooled rows %s: damaged (%v)", s.f.Name(), err)
}

// Close closes the spool (the Validated it came from removes it).
func (s *spoolReader) Close() error { return s.f.Close() }
