// The batchgen page: choose a sheet, write the template against its
// columns, start the task through the API and follow it live.
// No framework and no build step; every string comes from strings.js.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const FINISHED = new Set(["SUCCEEDED", "PARTIAL", "FAILED", "CANCELLED"]);
  const ACTIVE = new Set(["AWAITING_UPLOAD", "UPLOADED", "PENDING", "HELD", "RUNNING", "EXPORTING"]);
  // The rows a quote answers first, and the deadline its auto plan is
  // priced for when the task has none of its own.
  const QUOTE_SAMPLE = 20;
  const QUOTE_DEADLINE = "6h";
  const SHEET_EXT = /\.(xlsx|xlsm|csv|tsv)$/i;
  const TEXT_EXT = /\.(csv|tsv)$/i;
  const POLL_MS = 1000;
  // How much of a CSV/TSV too large to send whole is sent to be inspected:
  // plenty for the header and the sample rows.
  const HEAD_BYTES = 1 << 20;

  // ---- language --------------------------------------------------------
  let lang = pickLanguage();
  function pickLanguage() {
    const saved = localStorage.getItem("batchgen.lang");
    if (saved && window.STRINGS[saved]) return saved;
    const langs = navigator.languages && navigator.languages.length ? navigator.languages : [navigator.language || "en"];
    for (const l of langs) {
      const base = String(l).toLowerCase().split("-")[0];
      if (window.STRINGS[base]) return base;
    }
    return "en";
  }
  function t(key, vars) {
    let s = (window.STRINGS[lang] && window.STRINGS[lang][key]) || window.STRINGS.en[key] || key;
    if (vars) for (const k of Object.keys(vars)) s = s.split("{" + k + "}").join(String(vars[k]));
    return s;
  }
  function applyLanguage() {
    document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
    document.querySelectorAll("[data-i18n]").forEach((el) => { el.textContent = t(el.dataset.i18n); });
    document.querySelectorAll("[data-i18n-placeholder]").forEach((el) => { el.placeholder = t(el.dataset.i18nPlaceholder); });
    document.querySelectorAll(".lang-btn").forEach((b) => b.setAttribute("aria-pressed", String(b.dataset.lang === lang)));
    if (state.current) render(state.current);
    renderTasks();
    renderPreview();
    renderOutcols();
    if (state.error) showError(state.error);
  }

  // ---- state -----------------------------------------------------------
  const state = {
    file: null,        // the chosen File
    inspection: null,  // POST /ui/inspect's answer
    outcols: [],       // the answer columns being declared (renderOutcols)
    current: null,     // the task on show
    follow: null,      // {id, stop()} of the live follow
    tasks: [],
    error: null,       // {title, message} on show
    rate: null,        // client-side rate estimate {at, done, perSec}
    config: null,      // GET /ui/config.json's answer, once loaded
  };

  // ---- the server's page config ----------------------------------------
  // The largest sheet sent inside a request: behind API Gateway and Lambda
  // a larger one fails with the proxy's error, so it goes to the task's
  // upload URL instead. Without the config (an older server) every sheet
  // goes inline, as before.
  let configLoaded = null;
  function loadConfig() {
    configLoaded = configLoaded || fetch("/ui/config.json", { cache: "no-store" })
      .then((r) => (r.ok ? r.json() : null))
      .catch(() => null)
      .then((c) => { state.config = c || {}; applyModelRule(state.config); applyCostCaps(state.config); applyBatchModes(state.config); applyQuotes(state.config); return state.config; });
    return configLoaded;
  }
  // The API's rule for a task's model: a server that routes rows to the
  // models of its providers file, or that has no allow-list, refuses a task
  // naming another model, so the field is not offered; otherwise the
  // allowed models are suggested.
  function applyModelRule(c) {
    // No allow-list: the server runs its default model only.
    const fixed = !!c.model_fixed || !(c.models && c.models.length);
    $("model-field").hidden = fixed;
    $("model-fixed").hidden = !fixed;
    $("model-fixed").dataset.i18n = c.model_fixed ? "model.fixed" : "model.default";
    $("model-fixed").textContent = t($("model-fixed").dataset.i18n);
    if (fixed) $("model").value = "";
    const list = $("model-list");
    list.textContent = "";
    for (const m of c.models || []) {
      const o = document.createElement("option");
      o.value = m;
      list.appendChild(o);
    }
  }
  // A spending cap is offered where the server holds a task to one.
  // applyBatchModes offers economy and auto where the server runs provider
  // batches; the deadline only for auto.
  function applyBatchModes(c) {
    $("mode-field").hidden = !c.batch_modes;
    $("mode-hint").hidden = !c.batch_modes;
    if (!c.batch_modes) $("mode").value = "";
    $("deadline-field").hidden = $("mode").value !== "auto";
  }
  // A quote first is offered where the server holds tasks for one.
  function applyQuotes(c) {
    $("quote-first").hidden = !c.quotes;
    $("quote-first-hint").hidden = !c.quotes;
  }
  function applyCostCaps(c) {
    $("max-cost-field").hidden = !c.cost_caps;
    $("max-cost-hint").hidden = !c.cost_caps;
    if (!c.cost_caps) $("max_cost_usd").value = "";
  }
  function inline(file) {
    const n = state.config && state.config.max_inline_bytes;
    return !(n > 0) || file.size <= n;
  }
  function fmtSize(n) {
    if (n < 1024 * 1024) return Math.max(1, Math.round(n / 1024)) + " KB";
    return (n / (1024 * 1024)).toFixed(1) + " MB";
  }

  // ---- API -------------------------------------------------------------
  function token() { return localStorage.getItem("batchgen.token") || ""; }
  function headers(extra) {
    const h = Object.assign({}, extra || {});
    const tok = token();
    if (tok) h["Authorization"] = "Bearer " + tok;
    return h;
  }
  class APIError extends Error {
    constructor(status, code, message) { super(message); this.status = status; this.code = code; }
  }
  async function call(method, path, body) {
    let resp;
    try {
      resp = await fetch(path, { method, headers: headers(body && !(body instanceof FormData) ? { "Content-Type": "application/json" } : {}), body: body instanceof FormData ? body : body ? JSON.stringify(body) : undefined });
    } catch (e) {
      throw new APIError(0, "network", e.message);
    }
    return readJSON(resp);
  }
  async function readJSON(resp) {
    const text = await resp.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { /* not JSON: an HTML error page from a proxy */ }
    if (!resp.ok) {
      const e = data && data.error ? data.error : {};
      throw new APIError(resp.status, e.code || "http_" + resp.status, e.message || text.slice(0, 200) || resp.statusText);
    }
    return data;
  }

  // The API's task fields, whichever of the documented spellings it uses.
  const taskID = (v) => v.id || v.task_id;
  const taskState = (v) => v.status || v.state || "PENDING";
  const num = (x) => (typeof x === "number" && isFinite(x) ? x : 0);
  function links(v) {
    const id = taskID(v), l = v.links || {};
    const base = "/api/tasks/" + encodeURIComponent(id);
    return {
      self: l.self || base, events: l.events || base + "/events", result: l.result || base + "/result",
      cancel: l.cancel || base + "/cancel", retry: l.retry || base + "/retry",
      quote: l.quote || base + "/quote", start: l.start || base + "/start",
    };
  }
  function unwrap(v) { return v && v.task ? v.task : v; }

  // ---- errors ----------------------------------------------------------
  function titleFor(err) {
    if (err.code === "upload_failed") return t("err.upload");
    switch (err.status) {
      case 0: return t("err.network");
      case 400: case 422: return t("err.rejected");
      case 401: case 403: return t("err.auth");
      case 404: return t("err.notfound");
      case 409: return t("err.conflict");
      case 413: return t("err.too_large");
      case 415: return t("err.type");
    }
    return err.status >= 500 ? t("err.server") : t("err.rejected");
  }
  // showError shows {titleKey, messageKey, vars} or {err, message}; the
  // title is looked up each time so a language switch retranslates it.
  function showError(e) {
    state.error = e;
    $("error-title").textContent = e.err ? titleFor(e.err) : t(e.titleKey);
    $("error-message").textContent = e.messageKey ? t(e.messageKey, e.vars) : e.message || "";
    $("error").hidden = false;
  }
  function showAPIError(err) {
    // Network failures and 5xx carry nothing the user can act on.
    const plain = err.status === 0 || err.status >= 500 || err.status === 401;
    showError({ err, message: plain ? "" : err.message });
  }
  function clearError() { state.error = null; $("error").hidden = true; }

  // ---- file choice and inspection --------------------------------------
  async function chooseFile(file) {
    clearError();
    if (!file) return;
    if (!SHEET_EXT.test(file.name)) {
      resetFile();
      showError({ titleKey: "err.type", messageKey: "err.wrong_type" });
      return;
    }
    state.file = file;
    state.inspection = null;
    $("file-name").textContent = file.name;
    $("file-meta").textContent = t("file.reading");
    $("file-info").hidden = false;
    $("drop").hidden = true;
    $("task-form").hidden = true;
    await loadConfig();
    if (state.file !== file) return;
    const form = new FormData();
    if (inline(file)) {
      form.append("file", file, file.name);
    } else if (TEXT_EXT.test(file.name)) {
      // Too large to send whole: its head shows the columns and the first
      // rows; the whole sheet is checked when it is uploaded.
      form.append("file", file.slice(0, Math.min(HEAD_BYTES, state.config.max_inline_bytes)), file.name);
      form.append("partial", "head");
    } else {
      // A workbook is a zip, readable only whole: its columns are checked
      // when it arrives, and the template is written without the buttons.
      $("file-meta").textContent = t("file.large_book", { size: fmtSize(file.size) });
      renderColumns([]);
      $("template").value = "";
      setOutcols([]);
      $("task-form").hidden = false;
      renderPreview();
      return;
    }
    try {
      const ins = await call("POST", "/ui/inspect", form);
      if (state.file !== file) return; // another file was chosen meanwhile
      state.inspection = ins;
      const meta = ins.partial ? t("file.meta_head", { size: fmtSize(file.size), cols: ins.columns.length }) : t("file.meta", { rows: ins.rows, cols: ins.columns.length });
      $("file-meta").textContent = meta + (ins.sheet ? " · " + ins.sheet : "") + (ins.encoding ? " · " + ins.encoding : "");
      if (ins.rerun) {
        // A result sent back in: say what starting it would do, before it starts.
        $("file-meta").textContent += " · " + t(ins.rerun.from ? "file.rerun_from" : "file.rerun", rerunVars(ins.rerun));
      }
      renderColumns(ins.columns);
      $("template").value = ins.prompt || t("template.default", { first: "{{" + ins.columns[0] + "}}" });
      setOutcols(ins.output_columns);
      $("task-form").hidden = false;
      renderPreview();
    } catch (err) {
      if (state.file !== file) return;
      resetFile();
      showAPIError(err);
    }
  }
  // ---- answer columns ---------------------------------------------------
  // state.outcols holds the declared columns being edited: {name, type,
  // values ("a|b|c" for an enum), required, description}. None means one
  // text answer, as before.
  const OUTCOL_TYPES = ["text", "number", "integer", "boolean", "enum", "date", "list"];
  function setOutcols(cols) {
    state.outcols = (cols || []).map((c) => ({
      name: c.name || "", type: c.type || "text", values: (c.values || []).join("|"),
      required: !!c.required, description: c.description || "",
    }));
    renderOutcols();
  }
  function renderOutcols() {
    const box = $("outcols");
    box.textContent = "";
    state.outcols.forEach((c, i) => {
      const row = document.createElement("div");
      row.className = "outcol";
      row.dataset.index = i;
      const input = (cls, key, ph) => {
        const el = document.createElement("input");
        el.type = "text"; el.className = cls; el.value = c[key]; el.placeholder = t(ph); el.spellcheck = false;
        el.setAttribute("aria-label", t(ph));
        el.addEventListener("input", () => { c[key] = el.value; });
        return el;
      };
      const type = document.createElement("select");
      type.className = "outcol-type";
      for (const ty of OUTCOL_TYPES) {
        const o = document.createElement("option");
        o.value = ty; o.textContent = t("outcol.type." + ty);
        type.appendChild(o);
      }
      type.value = c.type;
      const values = input("outcol-values", "values", "outcol.values");
      values.classList.toggle("off", c.type !== "enum");
      type.addEventListener("change", () => { c.type = type.value; values.classList.toggle("off", c.type !== "enum"); });
      const req = document.createElement("label");
      req.className = "outcol-required";
      const box2 = document.createElement("input");
      box2.type = "checkbox"; box2.checked = c.required;
      box2.addEventListener("change", () => { c.required = box2.checked; });
      req.append(box2, " " + t("outcol.required"));
      const rm = document.createElement("button");
      rm.type = "button"; rm.className = "link outcol-remove"; rm.textContent = t("outcol.remove");
      rm.addEventListener("click", () => { state.outcols.splice(i, 1); renderOutcols(); });
      row.append(input("outcol-name", "name", "outcol.name"), type, values, req, input("outcol-description", "description", "outcol.description"), rm);
      box.appendChild(row);
    });
  }
  // outcolsField is the columns field of a new task: the declared columns
  // as a JSON list (the API's ColumnsDeclaration), or nothing.
  function outcolsField() {
    const cols = state.outcols.filter((c) => c.name.trim() || c.description.trim()).map((c) => {
      const col = { name: c.name.trim(), type: c.type };
      if (c.type === "enum") col.values = c.values.split("|").map((v) => v.trim());
      if (c.required) col.required = true;
      if (c.description.trim()) col.description = c.description.trim();
      return col;
    });
    return cols.length ? JSON.stringify(cols) : "";
  }

  function resetFile() {
    state.file = null; state.inspection = null;
    $("file").value = "";
    $("file-info").hidden = true;
    $("drop").hidden = false;
    $("task-form").hidden = true;
  }
  function renderColumns(cols) {
    const box = $("columns");
    box.textContent = "";
    for (const c of cols) {
      const b = document.createElement("button");
      b.type = "button"; b.className = "chip"; b.textContent = c; b.dataset.column = c;
      b.addEventListener("click", () => insertPlaceholder(c));
      box.appendChild(b);
    }
  }
  function insertPlaceholder(col) {
    const ta = $("template");
    const ph = "{{" + col + "}}";
    const start = ta.selectionStart ?? ta.value.length, end = ta.selectionEnd ?? ta.value.length;
    ta.value = ta.value.slice(0, start) + ph + ta.value.slice(end);
    ta.focus();
    ta.selectionStart = ta.selectionEnd = start + ph.length;
    renderPreview();
  }

  // parseTemplate mirrors internal/prompt.Parse, for the preview only: the
  // server checks the template again when the task is created.
  function parseTemplate(text) {
    if (!text.trim()) return { error: "err.template_empty" };
    const parts = [];
    let rest = text;
    for (;;) {
      const open = rest.indexOf("{{");
      if (open < 0) { if (rest) parts.push({ lit: rest }); return { parts }; }
      if (open > 0) parts.push({ lit: rest.slice(0, open) });
      const close = rest.indexOf("}}", open + 2);
      if (close < 0) return { error: "err.unclosed" };
      const name = rest.slice(open + 2, close).trim();
      if (!name) return { error: "err.empty_placeholder" };
      if (name.includes("{{")) return { error: "err.unclosed" };
      parts.push({ name });
      rest = rest.slice(close + 2);
    }
  }
  function renderPreview() {
    const ins = state.inspection;
    const pre = $("preview");
    if (!ins) {
      // A large workbook: nothing to preview against until it arrives.
      pre.classList.remove("bad");
      pre.textContent = state.file ? t("preview.unknown") : "";
      $("preview-row").textContent = "";
      return;
    }
    const p = parseTemplate($("template").value);
    pre.classList.remove("bad");
    $("preview-row").textContent = ins.sample.length ? t("preview.row") : "";
    if (p.error) {
      pre.textContent = t(p.error);
      pre.classList.toggle("bad", p.error !== "err.template_empty");
      return;
    }
    const index = new Map();
    ins.columns.forEach((c, i) => { if (!index.has(c.trim())) index.set(c.trim(), i); });
    const unknown = [...new Set(p.parts.filter((x) => x.name && !index.has(x.name)).map((x) => x.name))];
    if (unknown.length) {
      pre.textContent = t("err.unknown_column", { names: unknown.map((n) => "{{" + n + "}}").join(", "), columns: ins.columns.join(", ") });
      pre.classList.add("bad");
      return;
    }
    const row = ins.sample[0] || [];
    pre.textContent = p.parts.map((x) => (x.name ? row[index.get(x.name)] || "" : x.lit)).join("");
  }

  // ---- create ----------------------------------------------------------
  async function start(ev) {
    ev.preventDefault();
    await create(false);
  }
  // create sends the sheet with the form's settings; quote asks for a
  // quote first (the task is held while a sample of its rows is answered).
  async function create(quote) {
    if (!state.file) return;
    clearError();
    const file = state.file;
    const fields = { prompt: $("template").value };
    for (const f of ["system", "model", "temperature", "max_tokens", "rows_per_call", "max_cost_usd", "result_format"]) {
      const v = $(f).value.trim();
      if (v) fields[f] = v;
    }
    const mode = $("mode").value;
    if (mode) fields.mode = mode;
    const hours = Number($("deadline_hours").value);
    if (mode === "auto" && $("deadline_hours").value.trim()) fields.deadline = isFinite(hours) && hours > 0 ? Math.round(hours * 60) + "m" : $("deadline_hours").value.trim();
    const cols = outcolsField();
    if (cols) fields.columns = cols;
    // The encoding read from a head only is a guess about the rest: let the
    // server detect it on the whole sheet.
    if (state.inspection && state.inspection.encoding && !state.inspection.partial) fields.encoding = state.inspection.encoding;
    if (quote) fields.sample = String(QUOTE_SAMPLE);
    const btn = $(quote ? "quote-first" : "start"), label = quote ? "quote.first" : "start";
    btn.disabled = true; btn.textContent = t("starting");
    try {
      const created = inline(file) ? await createInline(file, fields) : await createAndUpload(file, fields, (pct) => { btn.textContent = t("uploading", { pct }); });
      const rows = state.inspection && !state.inspection.partial ? state.inspection.rows : 0;
      const view = Object.assign({ source: file.name, rows_total: rows }, created);
      resetFile();
      show(view);
      loadTasks();
    } catch (err) {
      showAPIError(err);
    } finally {
      btn.disabled = false; btn.textContent = t(label);
    }
  }
  // createInline sends the sheet with the task: checked, then split, in one
  // request.
  async function createInline(file, fields) {
    const form = new FormData();
    form.append("file", file, file.name);
    for (const [k, v] of Object.entries(fields)) form.append(k, v);
    return unwrap(await call("POST", "/api/tasks", form));
  }
  // createAndUpload creates the task with the JSON form of POST /api/tasks
  // and PUTs the sheet to the upload URL it answers with: on AWS a
  // presigned S3 URL, so the sheet never passes through the function.
  // Locally the PUT answers with the task (or why the sheet was refused);
  // S3 answers with nothing, and the splitter's verdict (the task FAILED
  // with its reason, or running) comes with the task's progress.
  async function createAndUpload(file, fields, onProgress) {
    const req = { filename: file.name, size: file.size };
    for (const [k, v] of Object.entries(fields)) {
      const n = Number(v);
      // Numbers go as numbers; a value that is none is sent as typed, for
      // the server to say what is wrong with it.
      req[k] = (k === "temperature" || k === "max_tokens" || k === "rows_per_call" || k === "max_cost_usd" || k === "sample") && v !== "" && isFinite(n) ? n : v;
      if (k === "columns") req[k] = JSON.parse(v); // a list of columns, not a string of one
    }
    const created = await call("POST", "/api/tasks", req);
    const answer = await put(created.upload_url, file, created.upload_headers || {}, onProgress);
    if (answer && taskID(answer)) return unwrap(answer);
    const view = Object.assign({}, created);
    for (const k of ["upload_url", "upload_method", "upload_headers", "expires_at"]) delete view[k];
    view.status = "UPLOADED";
    return view;
  }
  // put sends the file with XMLHttpRequest, which reports upload progress
  // (fetch does not). The bearer token goes only to this server's own
  // upload endpoint: a presigned URL carries its own signature, and S3
  // refuses a request with two.
  function put(url, file, uploadHeaders, onProgress) {
    return new Promise((resolve, reject) => {
      const xhr = new XMLHttpRequest();
      xhr.open("PUT", url);
      let h = {};
      for (const [k, v] of Object.entries(uploadHeaders)) {
        if (k.toLowerCase() !== "content-length") h[k] = v; // the browser sets it, from the file
      }
      if (new URL(url, location.href).origin === location.origin) h = headers(h);
      for (const [k, v] of Object.entries(h)) xhr.setRequestHeader(k, v);
      xhr.upload.onprogress = (e) => { if (e.lengthComputable && e.total) onProgress(Math.floor((e.loaded * 100) / e.total)); };
      xhr.onerror = () => reject(new APIError(0, "network", "the upload could not be sent"));
      xhr.onload = () => {
        const text = xhr.responseText || "";
        let data = null;
        try { data = text ? JSON.parse(text) : null; } catch (_) { /* S3 answers XML or nothing */ }
        if (xhr.status >= 200 && xhr.status < 300) { resolve(data); return; }
        if (data && data.error) { reject(new APIError(xhr.status, data.error.code, data.error.message)); return; }
        // S3's own refusal (an expired or mismatched URL): its XML message.
        const m = /<Message>([^<]*)<\/Message>/.exec(text);
        reject(new APIError(xhr.status, "upload_failed", m ? m[1] : "HTTP " + xhr.status));
      };
      xhr.send(file);
    });
  }

  // ---- the task on show ------------------------------------------------
  // rerunVars are the counts of a result sent back in as the strings name them.
  function rerunVars(r) {
    return { run: r.changed + r.new + r.cleared + r.flagged + r.failed, kept: r.kept, changed: r.changed + r.new,
      cleared: r.cleared, flagged: r.flagged, failed: r.failed, from: r.from || "" };
  }
  function show(view) {
    if (state.follow) state.follow.stop();
    state.rate = null;
    state.current = view;
    $("current").hidden = false;
    render(view);
    follow(view);
  }
  function progress(v) {
    const total = num(v.rows_total), done = num(v.rows_succeeded) + num(v.rows_failed) + num(v.rows_skipped);
    const st = taskState(v);
    if (st === "SUCCEEDED" || st === "PARTIAL") return { pct: 100, done: Math.max(done, total), total };
    if (!total) return { pct: 0, done, total };
    // 100% is kept for the finished state: the last rows may be answered
    // while the result is still being written.
    return { pct: Math.min(99, Math.floor((done * 100) / total)), done, total };
  }
  function rateOf(v, p) {
    // The server's own figures win; else estimate from what we saw.
    // The event stream's rate looks at the last seconds; the status
    // route's is the average since the start.
    const server = v.rate_per_second > 0 ? v.rate_per_second : v.rows_per_second;
    const now = performance.now();
    if (!state.rate || p.done < state.rate.done) state.rate = { at: now, done: p.done, perSec: null };
    else if (p.done > state.rate.done && now > state.rate.at) {
      const inst = ((p.done - state.rate.done) * 1000) / (now - state.rate.at);
      state.rate = { at: now, done: p.done, perSec: state.rate.perSec == null ? inst : 0.7 * state.rate.perSec + 0.3 * inst };
    }
    const perSec = typeof server === "number" ? server : state.rate.perSec;
    let eta = v.eta_seconds ?? v.eta;
    if (typeof eta !== "number" && perSec > 0 && p.total) eta = (p.total - p.done) / perSec;
    return { perSec, eta };
  }
  function fmtDuration(s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + (lang === "zh" ? " 秒" : " s");
    const m = Math.floor(s / 60), r = s % 60;
    if (m < 60) return lang === "zh" ? m + " 分 " + r + " 秒" : m + " min " + r + " s";
    return lang === "zh" ? Math.floor(m / 60) + " 小时 " + (m % 60) + " 分" : Math.floor(m / 60) + " h " + (m % 60) + " min";
  }
  function render(v) {
    const st = taskState(v), p = progress(v), r = rateOf(v, p);
    $("current-name").textContent = v.source || taskID(v);
    const badge = $("current-state");
    badge.textContent = t("state." + st);
    badge.dataset.state = st;
    const bar = $("bar");
    bar.setAttribute("aria-valuenow", String(p.pct));
    bar.dataset.state = st;
    $("bar-fill").style.width = p.pct + "%";
    $("bar-label").textContent = p.pct + "%";
    $("stat-done").textContent = p.total ? p.done + " / " + p.total : String(p.done);
    $("stat-failed").textContent = String(num(v.rows_failed));
    const still = FINISHED.has(st) || st === "HELD"; // a held task waits for its owner
    $("stat-rate").textContent = r.perSec > 0 && !still ? t("rate.value", { n: r.perSec >= 10 ? Math.round(r.perSec) : r.perSec.toFixed(1) }) : "–";
    $("stat-eta").textContent = FINISHED.has(st) ? t("eta.done") : typeof r.eta === "number" && isFinite(r.eta) && !still ? fmtDuration(r.eta) : "–";
    // An economy or auto task: what it costs and waits for.
    const md = $("current-mode");
    md.hidden = !v.mode;
    md.textContent = v.mode ? t("current.mode_" + v.mode, { deadline: v.deadline ? new Date(v.deadline).toLocaleString() : "" }) + (v.waiting_on ? " " + v.waiting_on.charAt(0).toUpperCase() + v.waiting_on.slice(1) + "." : "") : "";
    // A result sent back in: what became of its rows.
    const rr = $("current-rerun");
    rr.hidden = !v.rerun;
    rr.textContent = v.rerun ? t(v.rerun.from ? "current.rerun_from" : "current.rerun", rerunVars(v.rerun)) : "";
    const reason = $("current-reason");
    const why = v.error || v.reason;
    reason.hidden = !why;
    reason.textContent = why ? t("reason", { reason: why }) : "";
    $("download").disabled = !(st === "SUCCEEDED" || st === "PARTIAL" || (st === "CANCELLED" && !!v.result_url));
    $("retry").disabled = !(FINISHED.has(st) && st !== "FAILED" && num(v.rows_failed) > 0);
    $("cancel").disabled = !ACTIVE.has(st);
    renderQuote(v, st);
    const tr = $("transport");
    tr.dataset.transport = state.follow ? state.follow.transport : "";
    tr.textContent = state.follow && !FINISHED.has(st) ? t("transport." + state.follow.transport) : "";
  }
  // ---- a held task's quote ---------------------------------------------
  // While the task is held the page reads its quote (at most once a
  // second, while its sample is answered) and offers a Start per plan.
  function renderQuote(v, st) {
    const box = $("quote");
    box.hidden = st !== "HELD";
    if (st !== "HELD") return;
    const q = state.quote && state.quote.id === taskID(v) ? state.quote : null;
    if (!q || (q.sampling && performance.now() - state.quoteAt > POLL_MS)) loadQuote(v);
    if (!q) { $("quote-status").textContent = t("quote.measuring", { n: num(v.sample), done: 0 }); $("plans-table").hidden = true; return; }
    $("quote-status").textContent = q.sampling ? t("quote.measuring", { n: q.sample, done: q.tried })
      : q.measured ? t("quote.measured", { n: q.measured, left: q.left, spent: q.spent_usd != null ? money(q.spent_usd) : "–" })
        : t("quote.none");
    const body = $("plans");
    body.textContent = "";
    $("plans-table").hidden = q.sampling || !q.plans || !q.plans.length;
    for (const p of q.plans || []) {
      const tr = document.createElement("tr");
      tr.dataset.plan = p.mode;
      const cost = p.cost_usd ? (p.mode === "auto" ? money(p.cost_usd.low) + " – " + money(p.cost_usd.high) : money(p.cost_usd.mid) + " (" + money(p.cost_usd.low) + " – " + money(p.cost_usd.high) + ")") : "–";
      let time = p.note || "–";
      if (p.mode === "online" && p.seconds) time = t("plan.about", { d: fmtDuration(p.seconds.mid) });
      if (p.mode === "economy" && p.offered) time = t("plan.window");
      if (p.mode === "auto" && p.offered && p.seconds) time = t("plan.auto_time", { d: fmtDuration(p.seconds.high), e: fmtDuration(p.economy_seconds || 0) });
      [t("plan." + p.mode), p.offered ? cost : "–", time].forEach((text, i) => {
        const td = document.createElement("td");
        td.textContent = text;
        if (i === 2 && !p.offered) td.className = "hint";
        tr.appendChild(td);
      });
      const td = document.createElement("td");
      if (p.offered) {
        const b = document.createElement("button");
        b.type = "button"; b.className = "btn small" + (p.mode === "online" ? " primary" : "");
        b.textContent = t("plan.start");
        b.addEventListener("click", () => startPlan(v, p.mode));
        td.appendChild(b);
      }
      tr.appendChild(td);
      body.appendChild(tr);
    }
  }
  function money(x) { return x === 0 ? "$0" : "$" + (x >= 1 ? x.toFixed(2) : x.toPrecision(2)); }
  // The deadline the auto plan is priced and started with: the task's own,
  // else the form's hours, else QUOTE_DEADLINE.
  function quoteDeadline(v) {
    if (v.deadline) return v.deadline;
    const hours = Number($("deadline_hours").value);
    return isFinite(hours) && hours > 0 ? Math.round(hours * 60) + "m" : QUOTE_DEADLINE;
  }
  async function loadQuote(v) {
    if (state.quoteLoading) return;
    state.quoteLoading = true;
    state.quoteAt = performance.now();
    try {
      const q = await call("GET", links(v).quote + "?deadline=" + encodeURIComponent(quoteDeadline(v)));
      state.quote = q;
      if (state.current && taskID(state.current) === q.id) render(state.current);
    } catch (err) {
      showAPIError(err);
    } finally {
      state.quoteLoading = false;
    }
    // A sample still being answered: look again (the event stream may be
    // quiet while the first calls are made).
    if (state.quote && state.quote.sampling && state.current && taskID(state.current) === taskID(v) && taskState(state.current) === "HELD") {
      setTimeout(() => { if (state.current && taskState(state.current) === "HELD") loadQuote(state.current); }, POLL_MS);
    }
  }
  async function startPlan(v, mode) {
    clearError();
    const body = { mode };
    if (mode === "auto") body.deadline = quoteDeadline(v);
    try {
      state.quote = null;
      show(unwrap(await call("POST", links(v).start, body)));
      loadTasks();
    } catch (err) { showAPIError(err); }
  }
  function update(view, eventName) {
    if (!state.current || taskID(view) !== taskID(state.current)) return;
    // The page knows its upload arrived before the server has seen it
    // (an S3 upload is noticed by the splitter a moment later).
    if (taskState(view) === "AWAITING_UPLOAD" && taskState(state.current) === "UPLOADED") view = Object.assign({}, view, { status: "UPLOADED" });
    // Rate, ETA and what an economy task waits on are absent when unknown
    // or over: drop the old ones.
    const merged = Object.assign({}, state.current);
    delete merged.rows_per_second; delete merged.rate_per_second; delete merged.eta_seconds; delete merged.waiting_on;
    state.current = Object.assign(merged, view);
    render(state.current);
    const i = state.tasks.findIndex((x) => taskID(x) === taskID(view));
    if (i >= 0) { state.tasks[i] = Object.assign({}, state.tasks[i], view); renderTasks(); }
    if (FINISHED.has(taskState(view)) && !awaitingPartialResult(view, eventName)) {
      if (state.follow) state.follow.stop();
      loadTasks();
    }
  }
  // A cancelled task's partial result is written after the cancel: keep
  // following until the stream's done event (or a result link) says it is
  // there, but poll for it only a little while.
  function awaitingPartialResult(view, eventName) {
    if (taskState(view) !== "CANCELLED" || view.result_url || eventName === "done") return false;
    const f = state.follow;
    return !!f && !f.stopped && (f.transport === "sse" || ++f.cancelledPolls <= 10);
  }

  // ---- live follow: SSE over fetch, polling as the fallback -------------
  // EventSource cannot send the Authorization header, so the stream is read
  // with fetch and parsed here (text/event-stream framing).
  function follow(view) {
    const id = taskID(view);
    const f = { id, transport: "sse", stopped: false, ctrl: null, timer: null, cancelledPolls: 0 };
    f.stop = () => { f.stopped = true; if (f.ctrl) f.ctrl.abort(); clearTimeout(f.timer); };
    state.follow = f;
    // A finished task's stream is its done event alone; a cancelled task
    // needs it for the link to its partial result.
    if (FINISHED.has(taskState(view)) && taskState(view) !== "CANCELLED") { f.stop(); return; }
    stream(f, links(view).events, 0).catch(() => {}).finally(() => {
      if (!f.stopped) { f.transport = "poll"; render(state.current); poll(f, links(view).self); }
    });
  }
  async function stream(f, url, attempt) {
    let lastID = "";
    for (; attempt < 3 && !f.stopped; attempt++) {
      f.ctrl = new AbortController();
      const h = headers({ Accept: "text/event-stream" });
      if (lastID) h["Last-Event-ID"] = lastID;
      const resp = await fetch(url, { headers: h, signal: f.ctrl.signal, cache: "no-store" });
      if (!resp.ok || !(resp.headers.get("Content-Type") || "").startsWith("text/event-stream") || !resp.body) {
        throw new Error("no event stream: HTTP " + resp.status);
      }
      render(state.current);
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value.replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const ev = parseEvent(buf.slice(0, cut));
          buf = buf.slice(cut + 2);
          if (ev.id) lastID = ev.id;
          if (ev.data) {
            let data;
            try { data = JSON.parse(ev.data); } catch (_) { continue; }
            update(unwrap(data), ev.event);
            if (f.stopped) return;
          }
        }
      }
      attempt = 0; // a stream that delivered and ended cleanly: reconnect afresh
      if (f.stopped) return;
    }
    if (!f.stopped) throw new Error("event stream keeps ending");
  }
  function parseEvent(block) {
    const ev = { event: "message", data: "", id: "" };
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue; // comments are heartbeats
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? "" : line.slice(i + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "data") data.push(value);
      else if (field === "event") ev.event = value;
      else if (field === "id") ev.id = value;
    }
    ev.data = data.join("\n");
    return ev;
  }
  function poll(f, url) {
    const tick = async () => {
      if (f.stopped) return;
      try { update(unwrap(await call("GET", url))); } catch (err) {
        if (err.status === 404 || err.status === 401) { showAPIError(err); f.stop(); return; }
      }
      if (!f.stopped) f.timer = setTimeout(tick, POLL_MS);
    };
    tick();
  }

  // ---- buttons ---------------------------------------------------------
  async function download() {
    const v = state.current;
    if (!v) return;
    clearError();
    try {
      const resp = await fetch(links(v).result, { headers: headers() });
      if (!resp.ok) { await readJSON(resp); return; }
      const blob = await resp.blob();
      const a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = fileName(resp.headers.get("Content-Disposition")) || resultName(v.source || taskID(v));
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 60000);
    } catch (err) {
      showAPIError(err instanceof APIError ? err : new APIError(0, "network", String(err)));
    }
  }
  function fileName(cd) {
    if (!cd) return "";
    const star = /filename\*\s*=\s*UTF-8''([^;]+)/i.exec(cd);
    if (star) { try { return decodeURIComponent(star[1]); } catch (_) { /* fall through */ } }
    const plain = /filename\s*=\s*"?([^";]+)"?/i.exec(cd);
    return plain ? plain[1] : "";
  }
  function resultName(src) { return src.replace(/\.[^.]*$/, "") + ".result.xlsx"; }
  async function retry() {
    const v = state.current;
    clearError();
    try { show(unwrap(await call("POST", links(v).retry))); loadTasks(); } catch (err) {
      if (err.code === "nothing_to_retry") showError({ titleKey: "err.conflict", messageKey: "retry.none" });
      else showAPIError(err);
    }
  }
  // Cancel asks once, in place: the first click arms the button (its text
  // says what happens), a second click within a few seconds cancels.
  let cancelArmed = null;
  function disarmCancel() {
    clearTimeout(cancelArmed);
    cancelArmed = null;
    const b = $("cancel");
    b.classList.remove("armed");
    b.textContent = t("cancel");
  }
  async function cancel() {
    const v = state.current;
    const b = $("cancel");
    if (!cancelArmed) {
      b.classList.add("armed");
      b.textContent = t("confirm.cancel");
      cancelArmed = setTimeout(disarmCancel, 5000);
      return;
    }
    disarmCancel();
    clearError();
    try { update(unwrap(await call("POST", links(v).cancel))); loadTasks(); } catch (err) { showAPIError(err); }
  }

  // ---- the task list ---------------------------------------------------
  async function loadTasks() {
    try {
      const data = await call("GET", "/api/tasks?limit=20");
      state.tasks = (data && (data.tasks || data.items)) || [];
      renderTasks();
    } catch (err) {
      if (err.status === 401) showAPIError(err);
    }
  }
  function renderTasks() {
    const body = $("tasks");
    body.textContent = "";
    $("tasks-empty").hidden = state.tasks.length > 0;
    for (const v of state.tasks) {
      const tr = document.createElement("tr");
      tr.dataset.task = taskID(v);
      const st = taskState(v), p = progress(v);
      const cells = [v.source || taskID(v), t("state." + st), p.total ? p.pct + "% · " + p.done + "/" + p.total : "–", v.created_at ? new Date(v.created_at).toLocaleString(lang === "zh" ? "zh-CN" : "en") : ""];
      cells.forEach((text, i) => {
        const td = document.createElement("td");
        if (i === 1) { const b = document.createElement("span"); b.className = "badge"; b.dataset.state = st; b.textContent = text; td.appendChild(b); } else td.textContent = text;
        if (i === 0) td.className = "mono";
        tr.appendChild(td);
      });
      const td = document.createElement("td");
      const b = document.createElement("button");
      b.type = "button"; b.className = "link"; b.textContent = t("open");
      b.addEventListener("click", () => { show(v); window.scrollTo({ top: 0, behavior: "smooth" }); });
      td.appendChild(b);
      tr.appendChild(td);
      body.appendChild(tr);
    }
  }

  // ---- wiring ----------------------------------------------------------
  function init() {
    const drop = $("drop"), input = $("file");
    input.addEventListener("change", () => chooseFile(input.files[0]));
    $("mode").addEventListener("change", () => { $("deadline-field").hidden = $("mode").value !== "auto"; });
    ["dragenter", "dragover"].forEach((e) => drop.addEventListener(e, (ev) => { ev.preventDefault(); drop.classList.add("over"); }));
    ["dragleave", "drop"].forEach((e) => drop.addEventListener(e, () => drop.classList.remove("over")));
    drop.addEventListener("drop", (ev) => { ev.preventDefault(); chooseFile(ev.dataTransfer.files[0]); });
    // A file dropped beside the drop zone should not navigate away.
    window.addEventListener("dragover", (ev) => ev.preventDefault());
    window.addEventListener("drop", (ev) => ev.preventDefault());
    drop.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); input.click(); } });
    $("file-clear").addEventListener("click", () => { resetFile(); clearError(); });
    $("template").addEventListener("input", renderPreview);
    $("outcol-add").addEventListener("click", () => {
      state.outcols.push({ name: "", type: "text", values: "", required: false, description: "" });
      renderOutcols();
      const names = document.querySelectorAll("#outcols .outcol-name");
      if (names.length) names[names.length - 1].focus();
    });
    $("task-form").addEventListener("submit", start);
    $("quote-first").addEventListener("click", () => create(true));
    $("download").addEventListener("click", download);
    $("retry").addEventListener("click", retry);
    $("cancel").addEventListener("click", cancel);
    $("refresh").addEventListener("click", loadTasks);
    $("token").value = token();
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      localStorage.setItem("batchgen.token", $("token").value.trim());
      $("token-box").open = false;
      clearError();
      loadTasks();
    });
    document.querySelectorAll(".lang-btn").forEach((b) => b.addEventListener("click", () => {
      lang = b.dataset.lang;
      localStorage.setItem("batchgen.lang", lang);
      applyLanguage();
    }));
    applyLanguage();
    loadConfig();
    loadTasks();
  }
  init();
})();
