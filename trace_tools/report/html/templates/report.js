// trace-tools report.html: tabs, sortable tables, the session list, session pages and drift views.
// Session details live in gzip+base64 chunks (<script id="chunk-N">) decoded on first use, so the
// page loads the same way for 30 sessions or 10,000.
(function () {
  "use strict";
  const INDEX = JSON.parse(document.getElementById("report-index").textContent);
  const STRATEGIES = INDEX.strategies;
  const PAGE = 100;
  const NUM = new Intl.NumberFormat("en-US");
  const POSITION = new Map(INDEX.sessions.map((entry, i) => [entry[0], i]));
  const chunks = new Map();
  let sessionToken = 0;
  const TITLE = document.title;

  const FATES = {trained: "trained", partly: "partly trained",
    context: "context only (its tokens are in a sample, without loss)",
    dropped: "dropped (its generated tokens are in no sample)",
    untrained: "untrained (no samples to tell context from dropped)", empty: "empty generation"};
  const PROMPT_BADGE = {forked: "fork", realigned: "realign", restored: "restore", healed: "heal", reset: "reset",
    rendered: "render", new_chain: "chain", new_root: "root", rolled_back: "rollback", rejected: "reject",
    failed: "fail", anchored: "anchor"};
  const EVENT_BADGE = {demoted_by_merge: "merge", zeroed_by_realign: "zeroed", rolled_back: "rollback",
    trimmed: "trim", rejected: "reject", failed: "fail"};

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = value;
      else if (key === "style") node.style.cssText = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }
  const num = (n) => (n === null || n === undefined ? "n/a" : NUM.format(n));
  const count = (n, noun) => `${num(n)} ${noun}${n === 1 ? "" : "s"}`;
  const turnColour = (i) => `hsl(${(205 + i * 137.508) % 360}, 62%, 46%)`; // golden-angle hues, turn 0 blue
  const sessionHref = (sid, turn) => "#/session/" + encodeURIComponent(sid) + (turn === undefined ? "" : "/drift/" + turn);
  const causeName = (code) => INDEX.causes[code];

  // ---- sortable static tables (overview, drift causes) ----
  function makeSortable(table) {
    Array.from(table.tHead.rows[0].cells).forEach((th, col) => {
      th.addEventListener("click", () => sortTable(table, col, th));
    });
  }
  function sortTable(table, col, th) {
    const text = th.dataset.type === "text";
    const current = th.getAttribute("aria-sort");
    const dir = current ? (current === "ascending" ? "descending" : "ascending") : (text ? "ascending" : "descending");
    for (const h of table.tHead.rows[0].cells) h.removeAttribute("aria-sort");
    th.setAttribute("aria-sort", dir);
    const rows = Array.from(table.tBodies[0].rows);
    const value = (row) => {
      const raw = row.cells[col] ? row.cells[col].dataset.v : "";
      return raw === "" || raw === undefined ? null : (text ? raw.toLowerCase() : Number(raw));
    };
    rows.sort((a, b) => compare(value(a), value(b), dir));
    table.tBodies[0].append(...rows);
  }
  function compare(a, b, dir) {
    if (a === null || b === null) return a === b ? 0 : (a === null ? 1 : -1); // missing values last
    const order = a < b ? -1 : a > b ? 1 : 0;
    return dir === "ascending" ? order : -order;
  }

  // ---- session list ----
  const hasBehaviour = INDEX.behaviours.some((b) => b && b !== "unlabelled");
  const hasQuarantine = INDEX.sessions.some((e) => e[6]);
  const sessionColumns = [
    {name: "session", text: true, value: (e) => e[0]},
    // a zero-width space after each "+" lets a combined behaviour wrap there
    hasBehaviour && {name: "behaviour", text: true, wide: true, value: (e) => INDEX.behaviours[e[1]].replaceAll("+", "+\u200b")},
    {name: "turns", value: (e) => e[2]},
    {name: "drift causes", text: true, wide: true, value: (e) => e[3].map(causeName).join(" ")},
    ...STRATEGIES.map((s, k) => ({name: INDEX.labels[k], strategy: s, value: (e) => e[4][k]})),
    hasQuarantine && {name: "quarantined", text: true, value: (e) => e[6] || ""},
  ].filter(Boolean);
  // a text column aligns left; a wide-only one is left out of narrow windows (report.css)
  const columnClass = (col) => [col.text && "txt", col.wide && "wide-only"].filter(Boolean).join(" ") || null;
  const list = {query: "", sort: null, dir: "ascending", page: 0, rows: INDEX.sessions};
  let searchText = null;

  function setupSessionList() {
    const head = document.getElementById("session-head");
    sessionColumns.forEach((col, k) => {
      const th = el("th", {text: col.name, class: columnClass(col),
        title: col.strategy ? "samples emitted by " + col.strategy : null});
      th.addEventListener("click", () => {
        list.dir = list.sort === k && list.dir === "ascending" ? "descending" : "ascending";
        list.sort = k;
        for (const h of head.cells) h.removeAttribute("aria-sort");
        th.setAttribute("aria-sort", list.dir);
        refreshSessions();
      });
      head.append(th);
    });
    document.getElementById("session-table").classList.add("sortable");
    const search = document.getElementById("session-search");
    search.addEventListener("input", () => { list.query = search.value.trim().toLowerCase(); refreshSessions(); });
    refreshSessions();
  }
  function refreshSessions() {
    let rows = INDEX.sessions;
    if (list.query) {
      searchText = searchText || INDEX.sessions.map((e) =>
        [e[0], INDEX.behaviours[e[1]], ...e[3].map(causeName), e[6] || ""].join(" ").toLowerCase());
      rows = rows.filter((e, i) => searchText[i].includes(list.query));
    }
    if (list.sort !== null) {
      const col = sessionColumns[list.sort];
      const key = (e) => { const v = col.value(e); return v === undefined || v === "" ? null : v; };
      rows = rows.slice().sort((a, b) => compare(key(a), key(b), list.dir));
    }
    list.rows = rows;
    list.page = 0;
    drawSessions();
  }
  function drawSessions() {
    const body = document.getElementById("session-rows");
    const start = list.page * PAGE;
    const shown = list.rows.slice(start, start + PAGE);
    body.replaceChildren(...shown.map(sessionRow));
    document.getElementById("session-count").textContent = list.rows.length
      ? `showing ${num(start + 1)}–${num(start + shown.length)} of ${num(list.rows.length)} sessions`
      : "no session matches";
    pager("session-pager", list, drawSessions);
  }
  function sessionRow(e) {
    const cells = sessionColumns.map((col) => {
      const v = col.value(e);
      if (col.name === "session") return el("td", {}, el("a", {href: sessionHref(e[0]), class: "mono", text: v}));
      if (col.name === "drift causes") return el("td", {class: columnClass(col)}, ...e[3].map((c) => el("span", {class: "cause-chip", text: causeName(c)})));
      if (col.strategy) return el("td", {class: v > 1 ? "forked" : null, text: num(v)});
      return el("td", {class: columnClass(col), text: col.text ? v : num(v)});
    });
    return el("tr", {}, ...cells);
  }
  function pager(id, state, draw) {
    const pages = Math.max(1, Math.ceil(state.rows.length / PAGE));
    const box = document.getElementById(id);
    if (pages === 1) { box.replaceChildren(); return; }
    const button = (label, page) => {
      const b = el("button", {type: "button", text: label, disabled: page < 0 || page >= pages || page === state.page});
      b.addEventListener("click", () => { state.page = page; draw(); });
      return b;
    };
    box.replaceChildren(button("« first", 0), button("‹ prev", state.page - 1),
      el("span", {class: "muted", text: `page ${state.page + 1} of ${pages}`}),
      button("next ›", state.page + 1), button("last »", pages - 1));
  }

  // ---- drift list ----
  const drift = {cause: "", page: 0, rows: INDEX.drifted};
  function setupDriftList() {
    const select = document.getElementById("drift-cause");
    if (!select) return;
    const present = new Set(INDEX.drifted.map((d) => d[3]));
    INDEX.causes.forEach((c, code) => { if (present.has(code)) select.append(el("option", {value: c, text: c})); });
    select.addEventListener("change", () => { location.hash = select.value ? "#/drift/" + encodeURIComponent(select.value) : "#drift"; });
    filterDrift("");
  }
  function filterDrift(cause) {
    const select = document.getElementById("drift-cause");
    if (!select) return;
    select.value = cause;
    const code = INDEX.causes.indexOf(cause);
    drift.rows = cause ? INDEX.drifted.filter((d) => d[3] === code) : INDEX.drifted;
    drift.page = 0;
    drawDrift();
  }
  function drawDrift() {
    const start = drift.page * PAGE;
    const shown = drift.rows.slice(start, start + PAGE);
    document.getElementById("drift-rows").replaceChildren(...shown.map((d) => {
      const sid = INDEX.sessions[d[0]][0];
      return el("tr", {},
        el("td", {}, el("a", {href: sessionHref(sid, d[1]), class: "mono", text: sid})),
        el("td", {}, el("a", {href: sessionHref(sid, d[1]), text: String(d[1])})),
        el("td", {text: String(d[2])}),
        el("td", {}, el("span", {class: "cause-chip", text: causeName(d[3])})),
        el("td", {text: d[4] === null ? "no token drift" : `${num(d[4])} / ${num(d[5])}`}));
    }));
    document.getElementById("drift-count").textContent = count(drift.rows.length, "drifted turn");
    pager("drift-pager", drift, drawDrift);
  }

  // ---- session page ----
  async function loadChunk(k) {
    if (!chunks.has(k)) chunks.set(k, decodeChunk(document.getElementById("chunk-" + k).textContent.trim()));
    return chunks.get(k);
  }
  async function decodeChunk(b64) {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser cannot decompress the session data (no DecompressionStream); use a current Chrome, Firefox or Safari");
    }
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return JSON.parse(await new Response(stream).text());
  }
  async function openSession(sid, focusTurn) {
    const body = document.getElementById("session-body");
    const token = ++sessionToken;
    const pos = POSITION.get(sid);
    body.removeAttribute("data-session");
    if (pos === undefined) {
      body.replaceChildren(el("p", {class: "missing", text: `No session ${sid} in this run.`}));
      return;
    }
    const entry = INDEX.sessions[pos];
    body.replaceChildren(el("p", {class: "muted", text: "Loading…"}));
    let detail;
    try {
      detail = (await loadChunk(entry[5]))[sid];
    } catch (err) {
      body.replaceChildren(el("p", {class: "missing", text: String(err.message || err)}));
      return;
    }
    if (token !== sessionToken) return; // the reader moved on meanwhile
    body.replaceChildren(...renderSession(entry, detail));
    body.dataset.session = sid;
    document.title = `${sid} · trace-tools report`;
    const card = focusTurn === null ? null : document.getElementById("drift-" + focusTurn);
    if (card) { card.classList.add("focus"); card.scrollIntoView({block: "start"}); } else window.scrollTo(0, 0);
  }
  function renderSession(entry, d) {
    const causes = [...new Set(d.turns.filter((t) => t.cause).map((t) => t.cause))];
    const facts = [`${d.turns.length} turns`];
    if (d.behaviour && d.behaviour !== "unlabelled") facts.push(`behaviour ${d.behaviour}`);
    if (entry[6]) facts.push(`quarantined for a strategy: ${entry[6]}`);
    const out = [el("div", {class: "session-head"},
      el("p", {}, el("a", {href: "#sessions", text: "← all sessions"})),
      el("h2", {}, "Session ", el("code", {text: d.id})),
      el("p", {class: "muted"}, facts.join(" · "), " ", ...causes.map((c) => el("span", {class: "cause-chip", text: c}))))];
    out.push(el("h3", {id: "timeline", text: "Turn timeline per strategy"}), fateLegend(), timeline(d));
    out.push(el("h3", {id: "samples", text: "Emitted samples"}), barLegend());
    if (Object.values(d.strategies).every((s) => s.samples === null)) {
      out.push(el("p", {class: "missing", text: "This run has no samples (replayed with --no-samples): sample bars are not available."}));
    } else {
      const longest = Math.max(1, ...Object.values(d.strategies).flatMap((s) => (s.samples || []).map((x) => x.n)));
      for (const name of STRATEGIES) if (d.strategies[name]) out.push(strategyBars(name, d.strategies[name], longest));
    }
    out.push(el("h3", {id: "drift-view", text: "Drift"}), ...driftSection(d));
    return out;
  }
  function fateLegend() {
    return el("div", {class: "legend"}, ...Object.entries(FATES).map(([k, label]) =>
      el("span", {style: `--c: var(--${k})`, text: label})),
      el("em", {class: "muted", text: "badges: what became of the tokens (merge, zeroed, rollback…) and how the prompt was built (fork, realign, heal…)"}));
  }
  function timeline(d) {
    const head = el("tr", {}, el("th", {}));
    for (const t of d.turns) {
      head.append(el("th", {class: "turn", style: `--c: ${turnColour(t.i)}`,
        title: `turn ${t.i}: ${t.tool}, ${t.gen} generated tokens` + (t.cause ? `, drift: ${t.cause}` : "") +
          (t.genuine === false ? ", not genuine (superseded or repeated)" : "")},
        `${t.i}`, el("br"), el("span", {text: t.tool}),
        t.cause ? el("a", {class: "drift-mark", href: sessionHref(d.id, t.i), title: `drift: ${t.cause}`, text: " ◆"}) : null));
    }
    const rows = [];
    for (const name of STRATEGIES) {
      const s = d.strategies[name];
      if (!s) continue;
      const row = el("tr", {}, el("th", {class: "strategy", text: name}));
      s.turns.forEach(([trained, event, promptEvent, fate], k) => {
        const t = d.turns[k];
        const badges = [EVENT_BADGE[event], PROMPT_BADGE[promptEvent]].filter(Boolean);
        row.append(el("td", {class: "fate-" + fate,
          title: `${name}, turn ${t.i} (${t.tool}): ${FATES[fate]}; trained ${trained}/${t.gen}; event ${event}; prompt ${promptEvent}` +
            (t.cause ? `; drift ${t.cause}` : "")},
          `${num(trained)}/${num(t.gen)}`, badges.length ? el("span", {class: "badge", text: badges.join("·")}) : null));
      });
      rows.push(row);
    }
    return el("div", {class: "scroll"}, el("table", {class: "timeline"}, el("thead", {}, head), el("tbody", {}, ...rows)));
  }
  function barLegend() {
    return el("div", {class: "legend"},
      el("span", {style: "--c: linear-gradient(90deg, hsl(0,62%,46%), hsl(137,62%,46%), hsl(275,62%,46%))", text: "trained tokens, coloured by the turn that produced them"}),
      el("span", {style: "--c: repeating-linear-gradient(135deg, #888 0 2px, #fff 2px 4px)", text: "a turn's tokens without loss (context, zeroed)"}),
      el("span", {style: "--c: #e3e7ec", text: "prompt context (system, user, tool results)"}));
  }
  function strategyBars(name, s, longest) {
    const block = el("div", {class: "strategy-block", id: "bars-" + name.replace(/[^a-z0-9]+/gi, "-")});
    const forwarded = (s.samples || []).reduce((n, x) => n + x.n, 0);
    const trained = (s.samples || []).reduce((n, x) => n + x.trained, 0);
    block.append(el("h3", {}, el("code", {text: name}),
      ` · ${count((s.samples || []).length, "sample")} · ${num(forwarded)} tokens forwarded · ${num(trained)} trained`));
    for (const x of s.samples || []) {
      const bar = el("div", {class: "bar", style: `width: ${(100 * x.n / longest).toFixed(2)}%`});
      for (const [turn, isTrained, count] of x.segs) {
        const cls = turn < 0 ? "ctx" : (isTrained ? "trained" : "untrained");
        bar.append(el("div", {class: "seg " + cls, style: `flex: ${count} 0 0` + (turn >= 0 ? `; --c: ${turnColour(turn)}` : ""),
          title: (turn < 0 ? "context" : `turn ${turn}` + (isTrained ? ", trained" : ", no loss")) + ` · ${num(count)} tokens`}));
      }
      block.append(el("div", {class: "bar-row"},
        el("span", {class: "muted", text: `sample ${x.i} · ${num(x.n)} tok · ${num(x.trained)} trained`}), el("div", {}, bar)));
    }
    if (!(s.samples || []).length) block.append(el("p", {class: "muted", text: "no sample emitted"}));
    return block;
  }

  // ---- drift view (a session's echoed turns) ----
  function driftSection(d) {
    if (d.drift === null) {
      return [el("p", {class: "missing", text: "No drift.parquet in this run directory (an older run): token-level drift views are not available. Drift causes in the timeline come from turns.parquet."})];
    }
    const drifted = d.drift.filter((x) => x.cause || x.token_drift);
    const quiet = d.drift.filter((x) => !(x.cause || x.token_drift)).map((x) => x.turn);
    const out = drifted.map((x) => driftCard(x));
    if (!drifted.length) out.push(el("p", {text: d.drift.length ? "No echoed turn drifted." : "No turn of this session is echoed by a later request."}));
    if (quiet.length) out.push(el("p", {class: "quiet-list", text: `Echoed without drift: turn ${quiet.join(", ")}.`}));
    return out;
  }
  function driftCard(x) {
    const card = el("div", {class: "drift-card", id: "drift-" + x.turn});
    card.append(el("h4", {}, `turn ${x.turn} → echoed in turn ${x.echo} `,
      ...(x.causes.length ? x.causes : ["none"]).map((c) => el("span", {class: "cause-chip", text: c}))));
    if (x.cause && INDEX.cause_text[x.cause]) card.append(el("p", {text: INDEX.cause_text[x.cause]}));
    if (x.token_drift) {
      const where = x.divergence < x.prompt_len ? ", before this turn's response (an earlier part of the prompt was re-rendered differently)" : "";
      card.append(el("p", {class: "muted",
        text: `First divergence at token ${num(x.divergence)} of ${num(x.served_len)} served; turn ${x.turn}'s response starts at token ${num(x.prompt_len)}${where}.`}));
      card.append(alignView(x));
    } else {
      card.append(el("p", {class: "muted", text: "Token ids are identical (no token drift); the raw messages differ:"}));
    }
    if (x.diff.length) {
      card.append(el("div", {class: "small muted", text: "Message-level difference (stored response → echo):"}),
        el("ul", {class: "mdiff"}, ...x.diff.map((line) => el("li", {text: line}))));
    }
    return card;
  }
  function alignView(x) {
    const row = el("div", {class: "align-flex"});
    const side = (label) => el("div", {text: label});
    row.append(el("div", {class: "blk labels"}, side("served"), side("re-rendered")));
    const shared = () => el("div", {}, ...(x.start > 0 ? [el("span", {class: "tok shared", text: "…"})] : []),
      ...x.shared.map(([id, text], k) => tok(id, text, "shared", x.start + k)));
    row.append(el("div", {class: "blk shared"}, shared(), shared()));
    row.append(el("div", {class: "divergence", title: `first divergence: token ${x.divergence}`}));
    for (const [tag, s0, s1, r0, r1] of x.blocks) {
      const cls = tag === "equal" ? "same" : tag === "next" ? "next" : "diff";
      row.append(el("div", {class: "blk " + tag},
        el("div", {}, ...x.served.slice(s0, s1).map(([id, text], k) => tok(id, text, cls + " served", x.divergence + s0 + k))),
        el("div", {}, ...x.rendered.slice(r0, r1).map(([id, text], k) => tok(id, text, cls + " rendered", x.divergence + r0 + k)))));
    }
    return el("div", {class: "align"}, row);
  }
  function tok(id, text, cls, position) {
    const shown = text === "" ? "∅" : text.replace(/\n/g, "↵").replace(/\t/g, "⇥");
    return el("span", {class: "tok " + cls, title: `token ${position}: id ${id} = ${JSON.stringify(text)}`, text: shown});
  }

  // ---- routing ----
  const VIEWS = ["overview", "sessions", "drift", "session"];
  function show(view) {
    for (const v of VIEWS) document.getElementById(v).hidden = v !== view;
    for (const a of document.querySelectorAll(".tabs a")) {
      a.classList.toggle("active", a.dataset.tab === view || (view === "session" && a.dataset.tab === "sessions"));
    }
  }
  function route() {
    const hash = location.hash;
    if (hash.startsWith("#/session/")) {
      const parts = hash.slice("#/session/".length).split("/");
      show("session");
      openSession(decodeURIComponent(parts[0]), parts[1] === "drift" ? Number(parts[2]) : null);
      return;
    }
    document.title = TITLE;
    if (hash.startsWith("#/drift/")) {
      show("drift");
      filterDrift(decodeURIComponent(hash.slice("#/drift/".length)));
      return;
    }
    const id = hash.slice(1) || "overview";
    if (VIEWS.includes(id)) {
      show(id);
      if (id === "drift") filterDrift("");
      window.scrollTo(0, 0);
      return;
    }
    const target = document.getElementById(id);
    show(target && target.closest(".view") ? target.closest(".view").id : "overview");
    if (target) target.scrollIntoView();
  }

  // Per-step curves: pointing at a strategy in the legend picks its line out in every panel.
  function setupCurves() {
    const curves = document.querySelector(".curves");
    document.querySelectorAll(".curve-legend li").forEach((li) => {
      const pick = (on) => {
        curves.classList.toggle("picking", on);
        curves.querySelectorAll(".line").forEach((g) => g.classList.toggle("picked", on && g.dataset.strategy === li.dataset.strategy));
      };
      li.addEventListener("mouseenter", () => pick(true));
      li.addEventListener("mouseleave", () => pick(false));
    });
  }

  document.querySelectorAll("table.sortable").forEach(makeSortable);
  setupCurves();
  setupSessionList();
  setupDriftList();
  window.addEventListener("hashchange", route);
  route();
  window.reportState = {decodedChunks: () => chunks.size};  // lets tests check that loading stays lazy
  window.reportReady = performance.now();
})();
