package report

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/batchgen/batchgen/internal/pipeline"
)

// recentWindow is how far back the current rate looks: long enough to
// smooth over a batch's bursts, short enough that a 429 pause or a cut in
// the quota shows within seconds.
const recentWindow = 10 * time.Second

// heldBackWithin is how recent a 429 or a long quota wait must be for the
// progress line to say the job is being held back.
const heldBackWithin = 5 * time.Second

// rateMeter is the pure logic of the progress display: rows done over
// time, the rate over the recent window (pipeline.RateMeter, the page's
// too) beside the average since the start, and the ETA. It has no clock of
// its own; callers pass the time, so tests drive it with a fake one.
type rateMeter struct {
	total, base int
	start       time.Time
	recentRate  pipeline.RateMeter
}

// newRateMeter starts a meter of total rows, base of them done at start,
// paced by a quota of rpm requests a minute (0: unknown).
func newRateMeter(total, base int, start time.Time, rpm int) *rateMeter {
	m := &rateMeter{total: total, base: base, start: start, recentRate: pipeline.RateMeter{Window: recentWindow, Quota: float64(rpm) / 60}}
	m.recentRate.Add(start, base)
	return m
}

// add records that done rows were finished at now.
func (m *rateMeter) add(now time.Time, done int) { m.recentRate.Add(now, done) }

// recent is the rate in rows a second over the last window (the whole run
// until one window has passed).
func (m *rateMeter) recent() float64 { return m.recentRate.Rate() }

// average is the rate in rows a second since the start.
func (m *rateMeter) average(now time.Time) float64 {
	span := now.Sub(m.start).Seconds()
	if span <= 0 {
		return 0
	}
	return float64(m.done()-m.base) / span
}

func (m *rateMeter) done() int { return m.recentRate.Done() }

// eta is the time left at the recent rate, never faster than the quota
// allows; with no recent progress (a pause) the quota's pace, if known.
// ok is false when neither says anything.
func (m *rateMeter) eta() (time.Duration, bool) {
	d, ok := m.recentRate.ETA(m.total)
	return d.Round(time.Second), ok
}

// line is one progress line at now. heldBack says why the job is slowed
// down, if it is ("" if not).
func (m *rateMeter) line(now time.Time, failed int64, heldBack string) string {
	done := m.done()
	pct := 100 * float64(done) / float64(max(m.total, 1))
	eta := "?"
	if d, ok := m.eta(); ok {
		eta = d.String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "batchgen: %d/%d rows (%.0f%%), %d failed, %.1f rows/s now (%.1f avg), ETA %s", done, m.total, pct, failed, m.recent(), m.average(now), eta)
	if heldBack != "" {
		b.WriteString("; " + heldBack)
	}
	return b.String()
}

// final is the line printed once every row has a result.
func (m *rateMeter) final(now time.Time, failed int64) string {
	return fmt.Sprintf("batchgen: %d/%d rows (100%%), %d failed, %.1f rows/s avg, took %s", m.total, m.total, failed, m.average(now), now.Sub(m.start).Round(100*time.Millisecond))
}

// heldBack names why the job is being slowed, from when the provider last
// answered 429 and when a quota wait last took long (Unix nanoseconds, 0
// for never), as of now.
func heldBack(now time.Time, last429, lastQuotaWait int64, rpm int) string {
	recent := func(ns int64) bool { return ns != 0 && now.Sub(time.Unix(0, ns)) < heldBackWithin }
	switch {
	case recent(last429):
		return "rate-limited: the provider answered 429, pausing as it asked"
	case recent(lastQuotaWait) && rpm > 0:
		return fmt.Sprintf("rate-limited: waiting for the quota (%d requests/min)", rpm)
	case recent(lastQuotaWait):
		return "rate-limited: waiting for the quota learnt from the provider"
	}
	return ""
}

// ProgressCounts are what the progress line reads of a running engine
// (embedded.Stats.ProgressCounts).
type ProgressCounts struct {
	// Done and Failed count the rows this process finished.
	Done, Failed int64
	// Last429 and LastQuotaWait are when (Unix nanoseconds, 0 for never)
	// the provider last answered 429 and a quota wait last took long.
	Last429, LastQuotaWait int64
}

// ProgressConfig sets a Progress up.
type ProgressConfig struct {
	// Total rows of the task; Done of them already finished at the start
	// (a continued run counts from where it is).
	Total, Done int
	// Quiet prints nothing; Interval is the time between plain lines.
	Quiet    bool
	Interval time.Duration
	// RPM is the quota the provider set-up states (0: learnt).
	RPM int
	// Counts reads the engine's counts.
	Counts func() ProgressCounts
	// Waiting says what an economy task waits for ("" for nothing); nil
	// for an online task.
	Waiting func() string
}

// Progress shows rows done on a writer (stderr): a bar on a terminal,
// plain lines every interval otherwise, nothing when quiet; and a final
// line at 100%.
type Progress struct {
	w        io.Writer
	cfg      ProgressConfig
	meter    *rateMeter
	bar      *progressbar.ProgressBar
	last     time.Time
	finished bool
}

// NewProgress starts the progress of a run on w.
func NewProgress(w io.Writer, cfg ProgressConfig) *Progress {
	now := time.Now()
	p := &Progress{w: w, cfg: cfg, meter: newRateMeter(cfg.Total, cfg.Done, now, cfg.RPM), last: now}
	if cfg.Quiet {
		return p
	}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions(cfg.Total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("rows"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(200*time.Millisecond),
		)
		_ = p.bar.Set(cfg.Done)
	}
	return p
}

// Update reads the counts and shows them: the bar at once, a plain line
// once an interval has passed since the last.
func (p *Progress) Update() {
	if p.cfg.Quiet || p.finished {
		return
	}
	now := time.Now()
	c := p.cfg.Counts()
	done := p.meter.base + int(c.Done)
	p.meter.add(now, min(done, p.meter.total))
	held := heldBack(now, c.Last429, c.LastQuotaWait, p.cfg.RPM)
	if p.cfg.Waiting != nil {
		if e := p.cfg.Waiting(); e != "" {
			held = strings.TrimPrefix(held+"; "+e, "; ")
		}
	}
	if p.bar != nil {
		// The bar's own rate is an average; the description carries the
		// recent rate, the ETA and what holds the job back.
		eta := "?"
		if d, ok := p.meter.eta(); ok {
			eta = d.String()
		}
		desc := fmt.Sprintf("rows (%d failed, %.1f/s now, %.1f avg, ETA %s)", c.Failed, p.meter.recent(), p.meter.average(now), eta)
		if held != "" {
			desc += " " + held
		}
		p.bar.Describe(desc)
		_ = p.bar.Set(min(done, p.meter.total))
		return
	}
	if now.Sub(p.last) < p.cfg.Interval {
		return
	}
	p.last = now
	fmt.Fprintln(p.w, p.meter.line(now, c.Failed, held))
}

// Complete prints the final line once every row has a result.
func (p *Progress) Complete() {
	if p.cfg.Quiet || p.finished {
		return
	}
	p.Update()
	p.Finish()
	fmt.Fprintln(p.w, p.meter.final(time.Now(), p.cfg.Counts().Failed))
}

// Finish ends the bar (an interrupted run's too).
func (p *Progress) Finish() {
	if p.cfg.Quiet || p.finished {
		return
	}
	p.finished = true
	if p.bar != nil {
		_ = p.bar.Finish()
		fmt.Fprintln(p.w)
	}
}
