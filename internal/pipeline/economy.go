package pipeline

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/store"
)

// Economy mode (store.ModeEconomy, store.ModeAuto): a task's model calls go
// to the provider's batch API, at about half the online price, answered
// within hours.
//
// The generator works such a task's batches as it works any other: claims
// and fences, row results saved as they come, the attempt budget, final
// errors failing their row at once, re-asks of answers that do not fit the
// columns, the last batch starting the export. Only the call differs.
// Instead of going online under the quota, each row's call joins the
// task's lane: the lane gathers the calls of the task's rows for a moment,
// sends them as provider batches (split at the provider's limits), records
// each batch in the task's journal, polls it, and hands every row its own
// answer, matched by the line's id (never by position: providers return
// lines in any order). A line the provider failed for good fails its row as
// online; a retryable one, or one the batch left unfinished (it expired or
// was cancelled), is a failed attempt, and the row's next attempt joins the
// next provider batch, within the same budget. A row already answered is
// never sent again: the generator never calls for a row with a result.
//
// A line's id is the hash of what it asks and its number among the lines
// of its batch asking the same, so a process that was killed finds its
// lines again in the journal: a row of it asking the same question attaches
// to the provider batch already sent instead of sending it again, and its
// answer, paid for already, is read back.
//
// In auto mode, the lane cuts over when the deadline leaves just the time
// the rows still waiting would take online (OnlineRate, with a margin): it
// cancels its provider batches, keeps every answer they returned, and the
// rows left are called online under the quota, as an online task's are.

// EconomyConfig tunes a generator's provider batches.
type EconomyConfig struct {
	// Journal records the provider batches each task sent, so that a
	// process that was killed neither sends their rows again nor loses
	// their answers (both stores keep one). Required: without one,
	// economy and auto tasks are called online, saying why, rather than
	// risk paying for their rows twice.
	Journal store.ProviderBatches
	// Gather is how long a lane waits for more rows after the last one
	// came before it sends a provider batch (at once when the batch is
	// full). Defaults to 2 seconds.
	Gather time.Duration
	// Poll is how often a provider batch is asked for its state. Defaults
	// to 30 seconds.
	Poll time.Duration
	// MaxLines and MaxBytes lower the provider's limits of one batch
	// (llm.BatchLimits); 0 keeps them.
	MaxLines int
	MaxBytes int64
	// OnlineRate is how many rows a second the task's rows are answered at
	// online: auto mode cuts over when the rows waiting would need the
	// time left at this pace. Defaults to Concurrency rows every 2
	// seconds.
	OnlineRate float64
	// CutOverMargin is the time an auto task keeps beside what its
	// waiting rows need online at OnlineRate (plus a tenth): for the
	// provider batches' cancel, the export, and a pace that falls short.
	// Defaults to 30 seconds.
	CutOverMargin time.Duration
	// RefusalWait is the first wait before a batch the provider refused
	// for now (a 429, a queue limit) is sent again; it doubles with each
	// refusal in a row, to 10 minutes. Defaults to 30 seconds.
	RefusalWait time.Duration
	// Park makes a runtime that cannot wait hours (a Lambda invocation
	// lasts minutes) hand a batch back rather than wait for its provider
	// batches: a row whose line is in a provider batch still running is
	// left as it was, without an attempt, and the batch's message comes
	// again after Poll (a fresh one: waiting on a provider is not a
	// failure). Each delivery asks the provider once.
	Park bool
	// IdleLane is how long a task's lane is kept with nothing gathering or
	// in flight (its task done, or its rows gone with their process):
	// then it is dropped, and made again from the journal if its task
	// runs again. Defaults to 10 minutes.
	IdleLane time.Duration
}

func (c EconomyConfig) withDefaults(concurrency int) EconomyConfig {
	c.CutOverMargin = cmp.Or(c.CutOverMargin, DefaultCutOverMargin)
	c.RefusalWait = cmp.Or(c.RefusalWait, 30*time.Second)
	c.IdleLane = cmp.Or(c.IdleLane, 10*time.Minute)
	c.Gather = cmp.Or(c.Gather, 2*time.Second)
	c.Poll = cmp.Or(c.Poll, 30*time.Second)
	if c.Park {
		// A parked batch's message is sent again with the poll as its
		// delay, and SQS delays a message 15 minutes at most.
		c.Poll = min(c.Poll, MaxParkPoll)
	}
	if c.OnlineRate <= 0 {
		c.OnlineRate = float64(concurrency) / 2
	}
	return c
}

// LegacyJournal is a task's journal as the embedded runtime first kept it:
// one JSON array of entries per task in the data directory's blobs
// (economy/TASK.json). A task with no entries in Journal takes those, and
// records them in Journal, so that provider batches sent before an upgrade
// are neither lost nor paid twice.
type LegacyJournal struct {
	Journal store.ProviderBatches
	Blobs   blob.Store
}

var _ store.ProviderBatches = LegacyJournal{}

func legacyJournalKey(taskID string) string { return "economy/" + taskID + ".json" }

// ListProviderBatches implements store.ProviderBatches.
func (j LegacyJournal) ListProviderBatches(ctx context.Context, taskID string) ([]store.ProviderBatch, error) {
	entries, err := j.Journal.ListProviderBatches(ctx, taskID)
	if err != nil || len(entries) > 0 {
		return entries, err
	}
	r, err := j.Blobs.Open(ctx, legacyJournalKey(taskID))
	if errors.Is(err, blob.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the batch journal of task %s: %w", taskID, err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read the batch journal of task %s: %w", taskID, err)
	}
	if err := json.Unmarshal(data, &entries); err != nil {
		return nil, fmt.Errorf("decode the batch journal of task %s: %w", taskID, err)
	}
	for _, e := range entries {
		if err := j.Journal.RecordProviderBatch(ctx, taskID, e); err != nil {
			return nil, err
		}
	}
	return entries, nil
}

// RecordProviderBatch implements store.ProviderBatches.
func (j LegacyJournal) RecordProviderBatch(ctx context.Context, taskID string, e store.ProviderBatch) error {
	return j.Journal.RecordProviderBatch(ctx, taskID, e)
}

// errLaneClosed: the task's lane has cut over to online (auto mode); the
// call goes online, and nothing was attempted for it.
var errLaneClosed = errors.New("the task's provider batches are cut over to online")

// MaxParkPoll is the longest poll of a parking runtime: SQS's longest
// message delay.
const MaxParkPoll = 15 * time.Minute

// errTooFewLines: the call's batch would hold fewer lines than the
// provider takes in one (llm.BatchLimits.MinLines): it goes online.
var errTooFewLines = fmt.Errorf("%w: too few rows for a provider batch", errLaneClosed)

// errParked: the call's line is in a provider batch still running, and the
// runtime parks rather than wait (EconomyConfig.Park). Nothing was
// attempted; the row's next delivery finds the line again.
var errParked = fmt.Errorf("%w: its provider batch is still running", errNotStarted)

// ParkedReason is the last error of a batch handed back to wait for its
// provider batches (EconomyConfig.Park): the sweeper lets it wait, and
// does not count its claims as a crash loop's.
const ParkedReason = "waiting on provider batches"

// errLaneUnsure fails the calls of a batch whose submit failed when the
// provider could not say whether it took it: a failed attempt, retried
// later as a server error is, through a lane made again from the journal,
// whose intent asks the provider first.
var errLaneUnsure = &llm.Error{Class: llm.ClassServer, Message: "a provider batch's submit failed and the provider could not say whether it took it; the rows wait to ask again"}

// EconomyStatus is what a task's lane is waiting for, for a progress line.
type EconomyStatus struct {
	// Batches are the provider batches of this process still running, as
	// the provider last reported them.
	Batches []llm.BatchStatus
	// Gathering is how many calls wait to be sent.
	Gathering int
	// Online is set once an auto task has cut over; CutOverAt is when it
	// will (zero for economy).
	Online    bool
	CutOverAt time.Time
	// Why says why an auto task went online (its deadline).
	Why string
	// Sent and Lines count the provider batches this process sent for the
	// task and their lines.
	Sent, Lines int
}

// String says what the task waits for, for a progress line: "waiting on
// 2 provider batches (3400/5000 lines done, 12 failed)", or "" when
// nothing.
func (s EconomyStatus) String() string {
	var parts []string
	if len(s.Batches) > 0 {
		total, done, failed := 0, 0, 0
		for _, b := range s.Batches {
			total, done, failed = total+b.Total, done+b.Completed, failed+b.Failed
		}
		p := fmt.Sprintf("waiting on %d provider batch", len(s.Batches))
		if len(s.Batches) > 1 {
			p += "es"
		}
		p += fmt.Sprintf(" (%d/%d lines done", done, total)
		if failed > 0 {
			p += fmt.Sprintf(", %d failed", failed)
		}
		parts = append(parts, p+")")
	}
	if s.Gathering > 0 {
		parts = append(parts, fmt.Sprintf("%d rows gathering into a provider batch", s.Gathering))
	}
	switch {
	case s.Online:
		parts = append(parts, "online since "+s.Why)
	case !s.CutOverAt.IsZero():
		parts = append(parts, "online from "+s.CutOverAt.Local().Format("15:04:05")+" unless done before")
	}
	return strings.Join(parts, "; ")
}

// lanes are a generator's lanes, one per economy task it works.
type lanes struct {
	mu sync.Mutex
	m  map[string]*lane
	// warned are the economy tasks told to run online.
	warned map[string]bool
	// swept is when idle lanes were last looked for.
	swept time.Time
	// submit holds the lanes' submits one at a time (lane.submit).
	submit sync.Mutex
	// taken are the provider batches the lanes sent, from the moment the
	// provider took them.
	taken map[string]bool
}

// lane gathers the calls of one task's rows into provider batches.
type lane struct {
	g      *Generator
	taskID string
	bp     llm.BatchProvider
	// model, when set, replaces the request's (a route among several).
	model string
	// label is the provider label of the lane's answers (pricing.BatchLabel
	// of the route's).
	label  string
	limits llm.BatchLimits
	cfg    EconomyConfig
	log    *slog.Logger

	mu        sync.Mutex
	gathering []*lineCall
	gatherB   int64
	timer     *time.Timer
	// recovered are the lines of sent batches without a caller, by
	// question: a call asking it attaches to one instead of sending it
	// again.
	recovered map[string][]lineRef
	jobs      map[string]*laneJob
	deadline  time.Time
	cutAt     time.Time
	closed    bool
	closedC   chan struct{}
	why       string
	// sent and lines count the batches sent and their lines; sending the
	// batches being sent.
	sent, lines, sending int
	// refusals counts the provider batches refused for a queue limit in
	// a row: the wait before sending again doubles with each.
	refusals int
	// jobCap is how many of this lane's provider batches the provider had
	// in flight when it refused another for now (a concurrent-jobs quota,
	// learned from that refusal; 0 until one comes): the lane sends no
	// more than that at once, waiting for one to end rather than asking
	// again blindly. jobEnded is closed, and replaced, whenever one of its
	// provider batches ends.
	jobCap   int
	jobEnded chan struct{}
	// used is when a call last came.
	used time.Time
	// refreshed is when the journal was last read (a parking fleet reads it
	// again each Poll/2: other instances send batches of the task too).
	refreshed time.Time
	// stale is set when a batch's submit failed and the provider could not
	// say whether it took it: the next call makes the lane again from the
	// journal, which asks.
	stale bool
}

// idle reports whether l has had nothing gathering or in flight, and no
// call, for at least d.
func (l *lane) idle(now time.Time, d time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.gathering) > 0 || l.sending > 0 || now.Sub(l.used) < d {
		return false
	}
	for _, j := range l.jobs {
		if j.polling || j.live() > 0 {
			return false
		}
	}
	return true
}

func (l *lane) isStale() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stale
}

// lineRef is one line of a sent batch.
type lineRef struct {
	job *laneJob
	id  string
}

// laneJob is one provider batch.
type laneJob struct {
	id string
	// key is the lane's key of it ("" in a journal from before keys);
	// ended is set once its end is journaled.
	key    string
	ended  bool
	lines  map[string]*lineCall // by line id; nil until a call attaches
	status llm.BatchStatus
	// results are the outcomes of its lines no caller waited for when it
	// ended, kept for calls that attach later; nil until it ends.
	results map[string]llm.BatchResult
	polling bool
	sent    time.Time
}

// lineCall is one row's call waiting for its provider batch.
type lineCall struct {
	hash string
	req  llm.Request
	size int64
	done chan struct{}
	once sync.Once
	resp llm.Response
	err  error
	left bool // the caller stopped waiting (under lane.mu)
}

func (c *lineCall) deliver(resp llm.Response, err error) {
	c.once.Do(func() {
		c.resp, c.err = resp, err
		close(c.done)
	})
}

// questionHash identifies what req asks: the lines asking the same have the
// same hash.
func questionHash(req llm.Request) string {
	b, _ := json.Marshal(req)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// lineID is the id of the n-th line (from 0) of a batch asking question
// hash: short and of the characters every provider takes in a custom id.
func lineID(hash string, n int) string { return hash + "-" + strconv.Itoa(n) }

// lineHash is the question of line id.
func lineHash(id string) string {
	h, _, _ := strings.Cut(id, "-")
	return h
}

// SellsBatches reports whether a provider of r sells a batch API, which
// economy and auto tasks use.
func (r *Router) SellsBatches() bool {
	_, ok := r.batchRoute()
	return ok
}

// batchRoute finds the route whose provider sells a batch API.
func (r *Router) batchRoute() (*route, bool) {
	for _, x := range r.routes {
		if x.Batch != nil {
			return x, true
		}
	}
	return nil, false
}

// lane returns task's lane, made on first use; nil with the reason when
// the task's rows must be called online (no provider of the generator
// sells a batch API, or the runtime keeps no journal), or with an error
// when the journal cannot be read (the rows wait: online they could be
// paid twice, if a batch already sent answers them).
func (g *Generator) lane(ctx context.Context, task store.Task) (*lane, string, error) {
	g.lanes.mu.Lock()
	defer g.lanes.mu.Unlock()
	if now := g.cfg.Clock.Now(); now.Sub(g.lanes.swept) >= g.cfg.Economy.IdleLane/10 {
		// A server works many tasks over weeks: a lane that is done with
		// its task gives its memory back.
		g.lanes.swept = now
		for id, l := range g.lanes.m {
			if id != task.ID && l.idle(now, g.cfg.Economy.IdleLane) {
				delete(g.lanes.m, id)
			}
		}
	}
	if l, ok := g.lanes.m[task.ID]; ok && !l.isStale() {
		l.mu.Lock()
		watch := false
		if task.Mode == store.ModeAuto && !task.Deadline.Equal(l.deadline) {
			// A new deadline (a retry's); the first one starts the watch.
			watch = l.deadline.IsZero() && !l.closed
			l.deadline = task.Deadline
		}
		refresh := l.cfg.Park && g.cfg.Clock.Now().Sub(l.refreshed) >= l.cfg.Poll/2
		l.mu.Unlock()
		if watch {
			go l.watchDeadline()
		}
		if refresh {
			// Other instances work the task's other batches and send
			// their own provider batches: learn them before a call of a
			// row they sent asks again.
			if err := l.load(ctx); err != nil {
				return nil, "", err
			}
		}
		return l, "", nil
	}
	x, ok := g.router.batchRoute()
	if !ok {
		return nil, "its provider sells no batch API here", nil
	}
	if g.cfg.Economy.Journal == nil {
		return nil, "this runtime keeps no journal of provider batches, so a restart could pay for their rows twice", nil
	}
	label := x.Name
	if x.anonymous {
		label = ProviderLabel(task.Spec)
	}
	cfg := g.cfg.Economy
	limits := x.Batch.BatchLimits()
	if cfg.MaxLines > 0 && (limits.Lines <= 0 || cfg.MaxLines < limits.Lines) {
		limits.Lines = cfg.MaxLines
	}
	if cfg.MaxBytes > 0 && (limits.Bytes <= 0 || cfg.MaxBytes < limits.Bytes) {
		limits.Bytes = cfg.MaxBytes
	}
	l := &lane{
		g: g, taskID: task.ID, bp: x.Batch, model: x.Model, label: pricing.BatchLabel(label), limits: limits, cfg: cfg,
		log:       g.cfg.Logger.With("task_id", task.ID, "provider", label),
		recovered: map[string][]lineRef{}, jobs: map[string]*laneJob{}, closedC: make(chan struct{}),
		used: g.cfg.Clock.Now(), jobEnded: make(chan struct{}),
	}
	if task.Mode == store.ModeAuto {
		l.deadline = task.Deadline
	}
	if err := l.load(ctx); err != nil {
		return nil, "", err
	}
	if g.lanes.m == nil {
		g.lanes.m = map[string]*lane{}
	}
	g.lanes.m[task.ID] = l
	if !l.deadline.IsZero() {
		go l.watchDeadline()
	}
	return l, "", nil
}

// load reads the task's journal (recover) and takes the provider batches
// l does not know yet: their lines, for a call asking the same to attach
// to. Called under lanes.mu.
func (l *lane) load(ctx context.Context) error {
	now := l.g.cfg.Clock.Now()
	entries, err := l.recover(ctx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refreshed = now
	found := 0
	for _, e := range entries {
		if _, ok := l.jobs[e.Job]; ok {
			continue
		}
		found++
		j := &laneJob{id: e.Job, key: e.Key, lines: map[string]*lineCall{}, sent: e.Submitted, status: llm.BatchStatus{ID: e.Job, State: llm.BatchRunning, Total: len(e.Lines)}}
		for _, id := range e.Lines {
			j.lines[id] = nil
			l.recovered[lineHash(id)] = append(l.recovered[lineHash(id)], lineRef{job: j, id: id})
		}
		l.jobs[e.Job] = j
	}
	if found > 0 {
		l.log.Info("found provider batches in the task's journal", "batches", found)
	}
	return nil
}

// recover reads the task's journal: the provider batches it sent, those
// whose intent alone was recorded (a kill, or a lost answer, between the
// send and the record) asked of the provider by their key, and the answer
// recorded, so that the next run asks no more.
func (l *lane) recover(ctx context.Context) ([]store.ProviderBatch, error) {
	entries, err := l.cfg.Journal.ListProviderBatches(ctx, l.taskID)
	if err != nil {
		return nil, err
	}
	var jobs []store.ProviderBatch
	taken := l.g.lanes.knownLocked() // called under lanes.mu
	settled := map[string]bool{}
	for _, e := range entries {
		if e.Job != "" && !e.Ended {
			jobs = append(jobs, e)
			taken[e.Job] = true
		}
		if e.Job != "" || e.Gone {
			settled[e.Key] = true
		}
	}
	for _, e := range entries {
		if !e.Intent || e.Key == "" || settled[e.Key] {
			continue
		}
		if l.cfg.Park && l.g.cfg.Clock.Now().Sub(e.Submitted) < intentSettles {
			// Another instance of the fleet may be sending it right now:
			// asked too soon, the provider would not have it yet.
			continue
		}
		settled[e.Key] = true
		job, err := l.find(ctx, e.Key, e.Submitted, len(e.Lines), taken)
		if err != nil {
			return nil, fmt.Errorf("ask the provider for batch %s, sent but not recorded: %w", e.Key, err)
		}
		found := store.ProviderBatch{Key: e.Key, Job: job, Gone: job == "", Lines: e.Lines, Submitted: e.Submitted}
		if job != "" {
			l.log.Warn("found a provider batch sent but not recorded (a kill or a lost answer in between); its rows are not sent again", "batch", job, "lines", len(e.Lines))
			jobs = append(jobs, found)
			taken[job] = true
		} else {
			found.Lines = nil
		}
		if err := l.cfg.Journal.RecordProviderBatch(ctx, l.taskID, found); err != nil {
			return nil, err
		}
	}
	return jobs, nil
}

// intentSettles is how long after its intent a batch is surely sent or
// refused (a submit's 5 minutes, and a margin): a parking fleet asks the
// provider for an intent alone only then, as it may be another instance's
// submit under way.
const intentSettles = 7 * time.Minute

// find asks the provider for the batch sent under key since when with
// lines lines, not one of taken: its id, or "" when it has none.
func (l *lane) find(ctx context.Context, key string, since time.Time, lines int, taken map[string]bool) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return l.bp.FindBatch(ctx, llm.BatchQuery{Key: key, Lines: lines, Since: since, Taken: taken})
}

// EconomyStatus reports task taskID's lane in this process; false when it
// has none.
func (g *Generator) EconomyStatus(taskID string) (EconomyStatus, bool) {
	g.lanes.mu.Lock()
	l, ok := g.lanes.m[taskID]
	g.lanes.mu.Unlock()
	if !ok {
		return EconomyStatus{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := EconomyStatus{Gathering: len(l.gathering), Online: l.closed, CutOverAt: l.cutAt, Why: l.why, Sent: l.sent, Lines: l.lines}
	for _, j := range l.jobs {
		if j.status.State == llm.BatchRunning && j.live() > 0 {
			s.Batches = append(s.Batches, j.status)
		}
	}
	return s, true
}

// live is how many of j's lines a caller waits for (under lane.mu).
func (j *laneJob) live() int {
	n := 0
	for _, c := range j.lines {
		if c != nil && !c.left {
			n++
		}
	}
	return n
}

// call sends req in the task's next provider batch and waits for its line's
// outcome: until ctx ends (the row's batch lost or stopped), or start ends
// (no new call may start: the task cancelled, the process stopping), when
// the row stays as it was and its line, if sent, is left for a later
// attempt to find. errLaneClosed means the call must go online.
func (l *lane) call(ctx, start context.Context, req llm.Request, spend *budget) (RoutedResponse, error) {
	if l.model != "" {
		req.Model = l.model
	}
	held, settle := 0.0, func(llm.Usage) {}
	if spend != nil {
		h, err := spend.hold(ctx, l.label, req)
		if err != nil {
			return RoutedResponse{}, fmt.Errorf("%w: %w", errNotStarted, err)
		}
		held = h
		settle = func(u llm.Usage) { spend.settle(l.label, req, held, u) }
	}
	c := &lineCall{hash: questionHash(req), req: req, done: make(chan struct{})}
	began := l.g.cfg.Clock.Now()
	l.mu.Lock()
	l.used = began
	// A line already sent is read back even after an auto task's cut-over:
	// its answer may be paid for (a cancelled batch keeps what it did).
	if refs := l.recovered[c.hash]; len(refs) > 0 {
		ref := refs[0]
		l.recovered[c.hash] = refs[1:]
		ref.job.lines[ref.id] = c
		if r, ok := ref.job.results[ref.id]; ok {
			l.deliverLocked(c, r)
		} else if ref.job.results != nil {
			l.deliverLocked(c, unfinishedResult(ref.id, ref.job.status))
		} else if !ref.job.polling {
			ref.job.polling = true
			go l.poll(ref.job)
		}
	} else if l.closed {
		l.mu.Unlock()
		settle(llm.Usage{})
		return RoutedResponse{}, errLaneClosed
	} else {
		c.size = int64(len(c.req.Prompt) + len(c.req.System) + 512)
		l.gathering = append(l.gathering, c)
		l.gatherB += c.size
		switch {
		case (l.limits.Lines > 0 && len(l.gathering) >= l.limits.Lines) || (l.limits.Bytes > 0 && l.gatherB >= l.limits.Bytes*9/10):
			l.sendLocked()
		case l.timer == nil:
			l.timer = time.AfterFunc(l.cfg.Gather, l.flush)
		default:
			l.timer.Reset(l.cfg.Gather)
		}
	}
	l.mu.Unlock()

	select {
	case <-c.done:
	case <-ctx.Done():
	case <-start.Done():
	}
	select {
	case <-c.done:
	default:
		l.leave(c)
		settle(llm.Usage{})
		return RoutedResponse{}, fmt.Errorf("%w: %w", errNotStarted, cmp.Or(start.Err(), ctx.Err(), context.Canceled))
	}
	if errors.Is(c.err, errLaneClosed) {
		settle(llm.Usage{})
		return RoutedResponse{}, errLaneClosed
	}
	latency := l.g.cfg.Clock.Now().Sub(began)
	rec := CallRecord{Route: l.label, Latency: latency, Response: c.resp, Err: c.err}
	out := RoutedResponse{Response: c.resp, Route: l.label, Latency: latency, Calls: 1, Log: []CallRecord{rec}}
	if c.err != nil {
		settle(llm.Usage{})
		return RoutedResponse{Latency: latency, Calls: 1, Log: out.Log}, c.err
	}
	settle(c.resp.Usage)
	return out, nil
}

// leave is a caller that stopped waiting: a call not yet sent is dropped;
// a sent one stays in its batch, for a later attempt of its row to find.
func (l *lane) leave(c *lineCall) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.left = true
	for i, x := range l.gathering {
		if x == c {
			l.gathering = append(l.gathering[:i], l.gathering[i+1:]...)
			l.gatherB -= c.size
			return
		}
	}
	for _, j := range l.jobs {
		for id, x := range j.lines {
			if x == c {
				j.lines[id] = nil
				l.recovered[c.hash] = append(l.recovered[c.hash], lineRef{job: j, id: id})
				return
			}
		}
	}
}

// flush sends what has gathered.
func (l *lane) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sendLocked()
}

// sendLocked sends the calls gathered as one provider batch, in the
// background.
func (l *lane) sendLocked() {
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	calls := l.gathering
	l.gathering, l.gatherB = nil, 0
	if len(calls) == 0 {
		return
	}
	go l.send(calls)
}

// send submits calls as one provider batch, records it in the journal and
// polls it. A refusal the provider may lift (a queue limit, a 429, a
// server error) is tried again while callers wait; any other fails each
// call with it.
//
// The batch is recorded before it is sent (an intent, under its key) and
// again once the provider took it: a submit whose answer was lost is asked
// of the provider by its key before the lines are sent again, and a run
// killed between the two does the same when it resumes (lane.recover).
// Either way no line is paid twice. A batch whose intent cannot be
// recorded is not sent: its calls fail as an unreadable journal's do.
func (l *lane) send(calls []*lineCall) {
	l.mu.Lock()
	l.sending++
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.sending--
		l.mu.Unlock()
	}()
	var lines []llm.BatchLine
	var ids []string
	var jobID, key string
	var began time.Time
	for attempt := 0; ; attempt++ {
		// The callers still waiting: one that left while the batch was
		// refused asks again in a later batch of its own, and must not be
		// sent twice.
		l.mu.Lock()
		calls = slices.DeleteFunc(calls, func(c *lineCall) bool { return c.left })
		l.mu.Unlock()
		if len(calls) == 0 {
			return
		}
		if min := l.limits.MinLines; len(calls) < min {
			// Too few for the provider's batch (Bedrock's jobs take at
			// least 100 records): online, at the online price.
			l.log.Warn("too few rows for a provider batch; they are called online", "rows", len(calls), "min_lines", min)
			for _, c := range calls {
				c.deliver(llm.Response{}, errTooFewLines)
			}
			return
		}
		seen := map[string]int{}
		lines, ids = make([]llm.BatchLine, len(calls)), make([]string, len(calls))
		for i, c := range calls {
			ids[i] = lineID(c.hash, seen[c.hash])
			seen[c.hash]++
			lines[i] = llm.BatchLine{ID: ids[i], Req: c.req}
		}
		l.waitForRoom()
		id, k, at, err := l.submit(lines, ids)
		key, began = k, at
		if errors.Is(err, errLaneUnsure) || errors.Is(err, errJournal) {
			for _, c := range calls {
				c.deliver(llm.Response{}, err)
			}
			return
		}
		if err == nil {
			jobID = id
			break
		}
		e := llm.Classify(err)
		l.mu.Lock()
		live := 0
		for _, c := range calls {
			if !c.left {
				live++
			}
		}
		closed := l.closed
		l.mu.Unlock()
		if closed {
			err = errLaneClosed
		}
		if closed || !e.Class.Retryable() || live == 0 || attempt >= 8 {
			l.log.Warn("the provider refused a batch", "lines", len(lines), "error_class", e.Class, "error", e.Error())
			for _, c := range calls {
				c.deliver(llm.Response{}, err)
			}
			return
		}
		if l.learnJobCap(e) {
			continue // sent again once one of the lane's batches ends
		}
		wait := min(l.cfg.RefusalWait<<attempt, 10*time.Minute)
		wait = max(wait, e.RetryAfter)
		l.log.Info("the provider refused a batch for now; sending it again later", "lines", len(lines), "error_class", e.Class, "wait", wait, "error", e.Error())
		select {
		case <-l.g.cfg.Clock.After(wait):
		case <-l.closedC:
		}
	}
	l.log.Info("sent a provider batch", "batch", jobID, "lines", len(lines))
	j := &laneJob{id: jobID, key: key, lines: make(map[string]*lineCall, len(calls)), sent: began, polling: true,
		status: llm.BatchStatus{ID: jobID, State: llm.BatchRunning, Total: len(lines)}}
	l.mu.Lock()
	for i, c := range calls {
		if c.left {
			j.lines[ids[i]] = nil
			l.recovered[c.hash] = append(l.recovered[c.hash], lineRef{job: j, id: ids[i]})
			continue
		}
		j.lines[ids[i]] = c
	}
	l.jobs[jobID] = j
	l.sent++
	l.lines += len(lines)
	closed := l.closed
	l.mu.Unlock()
	if closed {
		l.cancelJob(j)
	}
	if l.cfg.Park && !closed {
		// Just sent: it is surely running. The next delivery asks.
		l.park(j)
		return
	}
	l.poll(j)
}

// park hands each caller of batch j, which is still running, errParked:
// its line stays in the batch, for the row's next delivery to find.
func (l *lane) park(j *laneJob) {
	l.mu.Lock()
	defer l.mu.Unlock()
	j.polling = false
	for id, c := range j.lines {
		if c == nil || c.left {
			continue
		}
		j.lines[id] = nil
		l.recovered[c.hash] = append(l.recovered[c.hash], lineRef{job: j, id: id})
		c.deliver(llm.Response{}, errParked)
	}
}

// errJournal wraps a journal that could not record a batch before it was
// sent: the batch is not sent, and its calls fail as an unreadable
// journal's do.
var errJournal = errors.New("record a provider batch in the journal")

// submit sends lines (of ids) as one provider batch, recorded in the
// journal before (its intent, under a new key) and after (its id), and
// returns the provider's id. A submit that failed in a way that may have
// created the batch asks the provider for it by its key before giving up:
// found, it is the batch sent. errLaneUnsure: the provider could not say.
//
// Submits are one at a time in a generator, so that a batch found by
// something less than its key (Anthropic's: its size and time) is never
// another one sent from this process.
func (l *lane) submit(lines []llm.BatchLine, ids []string) (id, key string, began time.Time, err error) {
	l.g.lanes.submit.Lock()
	defer l.g.lanes.submit.Unlock()
	key, began = newBatchKey(), l.g.cfg.Clock.Now()
	if err := l.record(store.ProviderBatch{Key: key, Intent: true, Lines: ids, Submitted: began}); err != nil {
		l.log.Warn("could not record a provider batch before sending it; its rows wait", "lines", len(lines), "error", err)
		return "", key, began, &llm.Error{Class: llm.ClassServer, Message: errJournal.Error() + ": " + err.Error(), Err: fmt.Errorf("%w: %w", errJournal, err)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	id, err = l.bp.SubmitBatch(ctx, key, lines)
	cancel()
	if err != nil && mayHaveCreated(err) {
		// The provider may have taken the batch and lost the answer:
		// sending it again could pay for every line twice.
		found, ferr := l.findLost(key, began, len(lines))
		switch {
		case ferr != nil:
			l.log.Warn("a provider batch's submit failed and the provider could not be asked whether it took it; its rows wait to ask again", "key", key, "lines", len(lines), "error", ferr)
			// The lane is made again from the journal for the next call,
			// asking the provider for this batch first.
			l.mu.Lock()
			l.stale = true
			l.mu.Unlock()
			return "", key, began, errLaneUnsure
		case found != "":
			l.log.Warn("a provider batch's submit failed, yet the provider took it; it is not sent again", "batch", found, "lines", len(lines), "error", err)
			id, err = found, nil
		}
	}
	if err != nil {
		_ = l.record(store.ProviderBatch{Key: key, Gone: true, Submitted: began})
		return "", key, began, err
	}
	l.g.lanes.mu.Lock()
	if l.g.lanes.taken == nil {
		l.g.lanes.taken = map[string]bool{}
	}
	l.g.lanes.taken[id] = true
	l.g.lanes.mu.Unlock()
	if err := l.record(store.ProviderBatch{Key: key, Job: id, Lines: ids, Submitted: began}); err != nil {
		// The batch runs and is polled; a killed run finds it again by its
		// intent.
		l.log.Warn("could not record a provider batch once sent; a killed run would ask the provider for it by its key", "batch", id, "error", err)
	}
	return id, key, began, nil
}

// recordEnd journals that batch j ended (its answers are in), once: what
// the task waits on is read from the journal by a process with no lanes
// (JournalWaitingOn). Best effort: a batch not marked ended shows as
// waited on until its task ends.
func (l *lane) recordEnd(j *laneJob) {
	l.mu.Lock()
	done := j.ended
	j.ended = true
	l.mu.Unlock()
	if !done {
		_ = l.record(store.ProviderBatch{Key: j.key, Job: j.id, Ended: true, Submitted: j.sent})
	}
}

// JournalWaitingOn says what an economy or auto task waits for as its
// journal tells, for a process with no lanes (the AWS stack's API): "waiting
// on 2 provider batches (batch_abc, batch_def), sent from 14:05 UTC", or ""
// when none is running. A lane's own view (Generator.EconomyStatus) adds
// what the provider last reported.
func JournalWaitingOn(j store.ProviderBatches) func(taskID string) string {
	return func(taskID string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return journalWaitingOn(ctx, j, taskID)
	}
}

// journalWaitingOn is JournalWaitingOn's answer for task taskID; "" when
// the journal cannot be read.
func journalWaitingOn(ctx context.Context, j store.ProviderBatches, taskID string) string {
	entries, err := j.ListProviderBatches(ctx, taskID)
	if err != nil {
		return ""
	}
	ended := map[string]bool{}
	for _, e := range entries {
		if e.Ended {
			ended[e.Job] = true
		}
	}
	var running []string
	var since time.Time
	for _, e := range entries {
		if e.Job == "" || e.Ended || ended[e.Job] || slices.Contains(running, e.Job) {
			continue
		}
		running = append(running, e.Job)
		if since.IsZero() || e.Submitted.Before(since) {
			since = e.Submitted
		}
	}
	if len(running) == 0 {
		return ""
	}
	names := running
	if len(names) > 3 {
		names = append(slices.Clone(names[:3]), "...")
	}
	plural := "batch"
	if len(running) > 1 {
		plural = "batches"
	}
	return fmt.Sprintf("waiting on %d provider %s (%s), sent from %s UTC", len(running), plural, strings.Join(names, ", "), since.UTC().Format("2006-01-02 15:04"))
}

// record adds e to the task's journal.
func (l *lane) record(e store.ProviderBatch) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return l.cfg.Journal.RecordProviderBatch(ctx, l.taskID, e)
}

// findLost asks the provider, a few times, whether it took the batch sent
// under key since began with lines lines after its submit failed.
func (l *lane) findLost(key string, began time.Time, lines int) (string, error) {
	taken := l.g.knownBatches()
	var err error
	for attempt := range 3 {
		var id string
		if id, err = l.find(context.Background(), key, began, lines, taken); err == nil {
			return id, nil
		}
		<-l.g.cfg.Clock.After(time.Duration(attempt+1) * 2 * time.Second)
	}
	return "", err
}

// knownBatches are the provider batches of every lane of g.
func (g *Generator) knownBatches() map[string]bool {
	g.lanes.mu.Lock()
	defer g.lanes.mu.Unlock()
	return g.lanes.knownLocked()
}

// knownLocked are the provider batches of every lane (under lanes.mu).
func (ls *lanes) knownLocked() map[string]bool {
	known := maps.Clone(ls.taken)
	if known == nil {
		known = map[string]bool{}
	}
	for _, l := range ls.m {
		l.mu.Lock()
		for id := range l.jobs {
			known[id] = true
		}
		l.mu.Unlock()
	}
	return known
}

// mayHaveCreated reports whether a submit that failed with err may have
// created its batch all the same: its answer lost to a timeout, a broken
// connection or a server error. A refusal (a 429, a bad request, a
// missing key) created nothing.
func mayHaveCreated(err error) bool {
	switch llm.Classify(err).Class {
	case llm.ClassServer, llm.ClassTimeout, llm.ClassConnection:
		return true
	}
	return false
}

// newBatchKey is a new key for a provider batch: unique, and of the
// characters every provider takes in metadata.
func newBatchKey() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "bg-" + hex.EncodeToString(b)
}

// poll follows batch j until it is final, then hands each line's outcome
// to its caller. It stops early when no caller waits any more (they find
// the batch again through recovered). In a task cancelled meanwhile, the
// provider batch is cancelled too: its finished lines keep their answers
// for a retry.
func (l *lane) poll(j *laneJob) {
	defer func() {
		l.mu.Lock()
		j.polling = false
		l.mu.Unlock()
	}()
	failures := 0
	for first := true; ; first = false {
		l.mu.Lock()
		live, closed := j.live(), l.closed
		l.mu.Unlock()
		if live == 0 {
			l.cancelIfTaskStopped(j)
			return
		}
		// Parking, a delivery asks once, at once: its callers came back
		// after a Poll's wait in the queue.
		park := l.cfg.Park && !closed
		if !park || !first {
			wait := l.cfg.Poll
			if closed {
				// Cancelled at the cut-over: look again soon, not in a loop.
				wait = min(wait, time.Second)
			}
			wake := l.closedC
			if closed {
				wake = nil
			}
			select {
			case <-l.g.cfg.Clock.After(wait):
			case <-wake:
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		st, err := l.bp.BatchStatus(ctx, j.id)
		cancel()
		if err != nil {
			failures++
			l.log.Warn("could not read a provider batch's state", "batch", j.id, "failures", failures, "error", err)
			e := llm.Classify(err)
			if !e.Class.Retryable() && (failures >= 3 || park) {
				l.finish(j, nil, err)
				return
			}
			if park {
				l.park(j)
				return
			}
			continue
		}
		failures = 0
		l.mu.Lock()
		j.status = st
		l.mu.Unlock()
		if !st.State.Final() {
			if park {
				l.park(j)
				return
			}
			continue
		}
		var results []llm.BatchResult
		for attempt := 0; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			results, err = l.bp.BatchResults(ctx, j.id)
			cancel()
			if err == nil || attempt >= 4 {
				break
			}
			l.log.Warn("could not read a provider batch's results; trying again", "batch", j.id, "error", err)
			<-l.g.cfg.Clock.After(time.Duration(attempt+1) * 5 * time.Second)
		}
		if err != nil {
			l.finish(j, nil, fmt.Errorf("read the results of provider batch %s: %w", j.id, err))
			return
		}
		if st.State == llm.BatchFailed && st.ErrorClass == llm.ClassRateLimited && len(results) == 0 {
			l.requeue(j, st)
			return
		}
		l.log.Info("provider batch done", "batch", j.id, "state", st.State, "completed", st.Completed, "failed", st.Failed)
		l.recordEnd(j)
		l.mu.Lock()
		l.refusals = 0
		l.mu.Unlock()
		l.finish(j, results, nil)
		return
	}
}

// learnJobCap learns the provider's concurrent-jobs quota from a refusal
// for now (e: a 429, a quota exceeded) that came while some of the lane's
// provider batches ran: no more than those run at once from now on. It
// reports whether it did, so that the batch refused waits for one of them
// to end instead of a blind wait. A lane that parks (a Lambda invocation)
// cannot wait for an end hours away, and waits as for any refusal.
func (l *lane) learnJobCap(e *llm.Error) bool {
	if l.cfg.Park || e.Class != llm.ClassRateLimited {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	running := len(l.runningLocked())
	if running == 0 {
		return false // a creation rate, not a count: wait it out
	}
	if l.jobCap == 0 || running < l.jobCap {
		l.jobCap = running
		l.log.Info("the provider refused another provider batch while some ran; no more than that at once from now on", "in_flight", running, "error", e.Error())
	}
	return true
}

// jobEndedLocked tells a batch waiting for room (waitForRoom) that one of
// the lane's provider batches ended; the caller holds l.mu.
func (l *lane) jobEndedLocked() {
	close(l.jobEnded)
	l.jobEnded = make(chan struct{})
}

// waitForRoom waits, when the lane learnt how many provider batches the
// provider takes at once (jobCap), until fewer than that run, or the lane
// closes.
func (l *lane) waitForRoom() {
	for {
		l.mu.Lock()
		full := l.jobCap > 0 && len(l.runningLocked()) >= l.jobCap
		ended := l.jobEnded
		l.mu.Unlock()
		if !full {
			return
		}
		select {
		case <-ended:
		case <-l.closedC:
			return
		}
	}
}

// requeue sends the lines of batch j, which the provider refused whole for
// a queue limit (st: its enqueued tokens; nothing ran, nothing was billed),
// again: in halves, from now on no larger than that (the lane learns the
// limit from the refusal), after a wait that doubles with each refusal in
// a row. The rows lose no attempt.
func (l *lane) requeue(j *laneJob, st llm.BatchStatus) {
	l.mu.Lock()
	var calls []*lineCall
	for id, c := range j.lines {
		if c != nil && !c.left {
			calls = append(calls, c)
		}
		j.lines[id] = nil
	}
	// A line of it no caller waits for yet is sent again when one does.
	j.results = map[string]llm.BatchResult{}
	l.jobEndedLocked()
	size := max(1, len(calls)/2)
	if l.limits.Lines <= 0 || size < l.limits.Lines {
		l.limits.Lines = size
	}
	size = l.limits.Lines
	l.refusals++
	wait := min(l.cfg.RefusalWait<<(l.refusals-1), 10*time.Minute)
	l.mu.Unlock()
	l.log.Warn("the provider refused a batch for its queue limit; sending its lines again in smaller batches",
		"batch", j.id, "lines", len(calls), "batch_lines_now", size, "wait", wait, "error", st.Error)
	go func() {
		select {
		case <-l.g.cfg.Clock.After(wait):
		case <-l.closedC:
			for _, c := range calls {
				c.deliver(llm.Response{}, errLaneClosed)
			}
			return
		}
		for len(calls) > 0 {
			n := min(size, len(calls))
			go l.send(calls[:n])
			calls = calls[n:]
		}
	}()
}

// finish hands each line of final batch j its outcome (err, when its
// results could not be read).
func (l *lane) finish(j *laneJob, results []llm.BatchResult, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if j.status.State == llm.BatchRunning {
		j.status.State = llm.BatchFailed // ended here, unread: not in flight
	}
	l.jobEndedLocked()
	if err != nil {
		for id, c := range j.lines {
			if c != nil {
				c.deliver(llm.Response{}, &llm.Error{Class: llm.ClassServer, Message: err.Error(), Err: err})
				j.lines[id] = nil
			}
		}
		return
	}
	byID := make(map[string]llm.BatchResult, len(results))
	for _, r := range results {
		if _, ours := j.lines[r.ID]; ours {
			byID[r.ID] = r
		}
	}
	// Only the outcomes of lines no caller waits for are kept, for a
	// later attempt of their rows to find; the others are handed over
	// and dropped, so a long-running server does not hold every answer.
	j.results = map[string]llm.BatchResult{}
	for id, c := range j.lines {
		r, ok := byID[id]
		if !ok {
			r = unfinishedResult(id, j.status)
		}
		if c == nil {
			j.results[id] = r
			continue
		}
		l.deliverLocked(c, r)
		j.lines[id] = nil
	}
}

// unfinishedResult is the outcome of line id, which batch st returned
// nothing for.
func unfinishedResult(id string, st llm.BatchStatus) llm.BatchResult {
	msg := fmt.Sprintf("provider batch %s ended %s without this line", st.ID, st.State)
	if st.Error != "" {
		msg += ": " + st.Error
	}
	return llm.BatchResult{ID: id, Err: &llm.Error{Class: llm.ClassBatchUnfinished, Message: msg}}
}

// deliverLocked hands c line r's outcome: an answer labelled as the
// batch's, or its error. After an auto cut-over a line the batch left
// unfinished goes online without counting as an attempt.
func (l *lane) deliverLocked(c *lineCall, r llm.BatchResult) {
	if r.Err != nil {
		if r.Err.Class == llm.ClassBatchUnfinished && l.closed {
			c.deliver(llm.Response{}, errLaneClosed)
			return
		}
		c.deliver(llm.Response{}, r.Err)
		return
	}
	resp := r.Response
	resp.Provider = l.label
	c.deliver(resp, nil)
}

// cancelIfTaskStopped cancels batch j, which no caller waits for any more,
// when its task was cancelled: the rows it has not answered would be paid
// for nothing.
func (l *lane) cancelIfTaskStopped(j *laneJob) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t, err := l.g.store.GetTask(ctx, l.taskID)
	if err != nil || t.State != store.TaskCancelled {
		return
	}
	l.mu.Lock()
	running := j.status.State == llm.BatchRunning
	l.mu.Unlock()
	if running {
		l.cancelJob(j)
	}
}

// runningLocked are l's provider batches not known to be final (under
// l.mu).
func (l *lane) runningLocked() []*laneJob {
	var running []*laneJob
	for _, j := range l.jobs {
		if j.status.State == llm.BatchRunning {
			running = append(running, j)
		}
	}
	return running
}

func (l *lane) cancelJob(j *laneJob) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := l.bp.CancelBatch(ctx, j.id); err != nil {
		l.log.Warn("could not cancel a provider batch", "batch", j.id, "error", err)
		return
	}
	l.log.Info("cancelled a provider batch; its finished lines keep their answers", "batch", j.id)
}

// watchDeadline cuts an auto task's lane over to online when the deadline
// leaves just the time its waiting rows would take online.
func (l *lane) watchDeadline() {
	for {
		l.mu.Lock()
		waiting := len(l.gathering)
		for _, j := range l.jobs {
			if j.status.State == llm.BatchRunning {
				waiting += max(j.live(), j.status.Total-j.status.Completed-j.status.Failed)
			}
		}
		need := onlineNeed(time.Duration(float64(waiting)/l.cfg.OnlineRate*float64(time.Second)), l.cfg.CutOverMargin)
		l.cutAt = l.deadline.Add(-need)
		cutAt := l.cutAt
		l.mu.Unlock()
		wait := cutAt.Sub(l.g.cfg.Clock.Now())
		if wait <= 0 {
			l.cutOver(fmt.Sprintf("%s: the deadline %s left just the time the %d rows waiting need online", l.g.cfg.Clock.Now().Local().Format("15:04:05"), l.deadline.Local().Format("15:04:05"), waiting))
			return
		}
		select {
		case <-l.g.cfg.Clock.After(min(wait, l.cfg.Poll, 10*time.Second)):
		case <-l.closedC:
			return
		}
	}
}

// cutOver closes the lane: the calls gathered go online, the provider
// batches are cancelled (their answers kept), and every later call goes
// online.
func (l *lane) cutOver(why string) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed, l.why = true, why
	close(l.closedC)
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	for _, c := range l.gathering {
		c.deliver(llm.Response{}, errLaneClosed)
	}
	l.gathering, l.gatherB = nil, 0
	running := l.runningLocked()
	l.mu.Unlock()
	l.log.Warn("auto mode: going online", "why", why, "provider_batches_cancelled", len(running))
	for _, j := range running {
		l.cancelJob(j)
	}
}

// call makes one model call for a row of task: in its provider batch when
// the task is in economy (or auto, until it cuts over), otherwise online
// through the router. A row of an economy task going online takes a row
// slot for the call, as every online row does.
func (g *Generator) call(ctx, start context.Context, mayStart func() bool, task store.Task, req llm.Request, spend *budget) (RoutedResponse, error) {
	if !task.Mode.Batched() {
		return g.router.route(ctx, start, mayStart, req, spend)
	}
	l, why, err := g.lane(ctx, task)
	if err != nil {
		// A failed attempt, retried with backoff and then in later rounds,
		// as a provider's 5xx would be: neither online nor a new batch
		// (a batch already sent might answer the row; either would pay
		// twice), and not at once again (a broken disk stays broken).
		return RoutedResponse{}, &llm.Error{Class: llm.ClassServer, Message: "read the journal of provider batches: " + err.Error(), Err: err}
	}
	if l != nil {
		resp, err := l.call(ctx, start, req, spend)
		if !errors.Is(err, errLaneClosed) {
			return resp, err
		}
	} else {
		g.warnOnline(task, why)
	}
	if !g.slots.acquire(start, task.Owner) {
		return RoutedResponse{}, fmt.Errorf("%w: %w", errNotStarted, cmp.Or(start.Err(), context.Canceled))
	}
	defer g.slots.release()
	return g.router.route(ctx, start, mayStart, req, spend)
}

// warnOnline says once per task why its economy rows are called online.
func (g *Generator) warnOnline(task store.Task, why string) {
	g.lanes.mu.Lock()
	defer g.lanes.mu.Unlock()
	if g.lanes.warned == nil {
		g.lanes.warned = map[string]bool{}
	}
	if g.lanes.warned[task.ID] {
		return
	}
	g.lanes.warned[task.ID] = true
	g.cfg.Logger.Warn("the task's rows are called online at the online price", "task_id", task.ID, "mode", task.Mode.String(), "why", why)
}

// WaitsForProviderBatches reports whether the batch of message body
// belongs to an economy or auto task: its rows wait for provider batches,
// for hours, without a row slot, so the embedded workers work it beside
// themselves rather than hold a worker that long (LocalWorkers). A message
// that cannot be read, or whose task cannot be, is worked as any other
// (Process says why it fails).
func (g *Generator) WaitsForProviderBatches(ctx context.Context, body []byte) bool {
	m, err := DecodeBatchMessage(body)
	if err != nil {
		return false
	}
	t, err := g.store.GetTask(ctx, m.TaskID)
	return err == nil && t.Mode.Batched()
}

// ParseModeDeadline reads a task's mode and deadline as the CLI, the API
// and the drop folder's settings take them: the mode by name (online,
// economy, auto; "" is online); the deadline as an RFC 3339 time or a
// duration from now ("6h"). Auto needs a deadline, the other modes take
// none, and a deadline must be ahead of now.
func ParseModeDeadline(mode, deadline string, now time.Time) (store.Mode, time.Time, error) {
	m, err := store.ParseMode(mode)
	if err != nil {
		return "", time.Time{}, err
	}
	deadline = strings.TrimSpace(deadline)
	if deadline == "" {
		if m == store.ModeAuto {
			return "", time.Time{}, errors.New("mode auto needs a deadline: when the task must be done (an RFC 3339 time such as 2026-12-02T18:00:00Z, or a duration from now such as 6h)")
		}
		return m, time.Time{}, nil
	}
	if m != store.ModeAuto {
		return "", time.Time{}, errors.New("deadline is for mode auto: economy waits for the provider's batches however long they take, online needs none")
	}
	t, err := time.Parse(time.RFC3339, deadline)
	if err != nil {
		d, derr := time.ParseDuration(deadline)
		if derr != nil {
			return "", time.Time{}, fmt.Errorf("deadline %q: want an RFC 3339 time (2026-12-02T18:00:00Z) or a duration from now (6h)", deadline)
		}
		t = now.Add(d)
	}
	if !t.After(now) {
		return "", time.Time{}, fmt.Errorf("deadline %s has passed", deadline)
	}
	return m, t.UTC().Truncate(time.Millisecond), nil
}

// CancelProviderBatches cancels the provider batches this process sent
// for task taskID that are still running: for a cancelled task, whose
// unanswered lines would otherwise be paid for nothing. The lines they
// finished keep their answers, which a retry reads back. A process about
// to exit calls it, as the lane's own check comes only at its next poll.
func (g *Generator) CancelProviderBatches(taskID string) {
	g.lanes.mu.Lock()
	l, ok := g.lanes.m[taskID]
	g.lanes.mu.Unlock()
	if !ok {
		return
	}
	l.mu.Lock()
	running := l.runningLocked()
	l.mu.Unlock()
	for _, j := range running {
		l.cancelJob(j)
	}
}
