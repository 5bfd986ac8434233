// autotune dashboard: the little script the server-rendered pages need.
//  - [data-live] regions refetch themselves from their URL until the server stops marking them live;
//  - the run page's cells select their details; the explain panel loads on request;
//  - the launch form posts to POST /v1/tables (or, for all kinds in the fleet, POST /v1/fleet/tables)
//    and puts the API's errors next to their fields; it shows each trainer's settings with it only;
//  - a table wider than its .scroll box marks the box, for the stylesheet's "scroll" cue.
"use strict";

const MAX_FAILURES = 5; // consecutive failed refreshes before a live region gives up and says so

function parseFragment(html) {
  const template = document.createElement("template");
  template.innerHTML = html.trim();
  return template.content.firstElementChild;
}

// -- live regions ------------------------------------------------------------------------------

function startLive(element) {
  const url = element.dataset.live;
  const interval = Number(element.dataset.interval) || 1000;
  let failures = 0;
  async function tick() {
    let next = null;
    try {
      const response = await fetch(url, { headers: { Accept: "text/html" }, cache: "no-store" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      next = parseFragment(await response.text());
      failures = 0;
    } catch (error) {
      failures += 1;
      if (failures >= MAX_FAILURES) {
        showNotice(element, `Live updates stopped (${error.message}); reload the page to try again.`);
        return;
      }
    }
    if (next) {
      const current = document.getElementById(element.id);
      if (!current) return;
      const state = saveState(current);
      unwatchScrolls(current);
      current.replaceWith(next);
      restoreState(next, state);
      watchScrolls(next);
      element = next;
      if (!next.dataset.live) {
        document.dispatchEvent(new CustomEvent("autotune:finished", { detail: next.id }));
        return;
      }
    }
    setTimeout(tick, interval);
  }
  setTimeout(tick, interval);
}

function showNotice(element, text) {
  const notice = document.createElement("p");
  notice.className = "alert";
  notice.setAttribute("role", "status");
  notice.textContent = text;
  element.prepend(notice);
}

function saveState(root) {
  return {
    checked: [...root.querySelectorAll("input[type=checkbox]:checked")].map((box) => box.value),
    selected: selectedCell(),
  };
}

function restoreState(root, state) {
  for (const box of root.querySelectorAll("input[type=checkbox]")) {
    if (state.checked.includes(box.value)) box.checked = true;
  }
  if (state.selected) selectCell(state.selected, { keepExplain: true });
}

// -- tables wider than their box ------------------------------------------------------------------
// Measured again whenever a box or its table changes size: a phone turned, a hidden cell detail
// shown, a live update or the explain panel swapped in (watchScrolls on the new part).

const scrollSizes = new ResizeObserver((entries) => {
  for (const entry of entries) {
    const box = entry.target.closest(".scroll");
    if (box) markOverflow(box);
  }
});

function markOverflow(box) {
  const over = box.scrollWidth > box.clientWidth + 1;
  box.toggleAttribute("data-overflow", over);
  box.toggleAttribute("data-at-end", over && box.scrollLeft + box.clientWidth >= box.scrollWidth - 1);
}

function watchScrolls(root) {
  for (const box of root.querySelectorAll(".scroll")) {
    scrollSizes.observe(box);
    if (box.firstElementChild) scrollSizes.observe(box.firstElementChild);
    markOverflow(box);
  }
}

function unwatchScrolls(root) {  // before a part is swapped out: the observer would keep it alive
  for (const box of root.querySelectorAll(".scroll")) {
    scrollSizes.unobserve(box);
    if (box.firstElementChild) scrollSizes.unobserve(box.firstElementChild);
  }
}

document.addEventListener("scroll", (event) => {
  if (event.target instanceof Element && event.target.matches(".scroll")) markOverflow(event.target);
}, true);

// -- run page: cells and their details ------------------------------------------------------------

function selectedCell() {
  const match = /^#cell-(.+)$/.exec(window.location.hash);
  return match ? decodeURIComponent(match[1]) : null;
}

function selectCell(key, { keepExplain = false } = {}) {
  const detail = document.getElementById(`detail-${key}`);
  if (!detail) return;
  for (const button of document.querySelectorAll(".cell-button")) {
    const on = button.dataset.cell === key;
    button.setAttribute("aria-pressed", String(on));
    button.closest("td").classList.toggle("selected", on);
  }
  for (const panel of document.querySelectorAll(".detail")) panel.hidden = panel !== detail;
  const hint = document.getElementById("detail-hint");
  if (hint) hint.hidden = true;
  const explain = document.getElementById("explain");
  if (explain && !keepExplain) {
    explain.hidden = true;
    unwatchScrolls(explain);
    explain.replaceChildren();
    delete explain.dataset.cell;
  }
  if (selectedCell() !== key) history.replaceState(null, "", `#cell-${encodeURIComponent(key)}`);
}

async function loadExplain(button) {
  const panel = document.getElementById("explain");
  if (!panel) return;
  const params = new URLSearchParams({ seq_len: button.dataset.seqLen, mode: button.dataset.mode });
  if (button.dataset.levers) params.set("levers", "true");
  panel.hidden = false;
  panel.dataset.cell = `${button.dataset.seqLen}-${button.dataset.mode}`;
  panel.setAttribute("aria-busy", "true");
  unwatchScrolls(panel);
  const what = button.dataset.levers ? "the max batch under each lever" : "where the memory goes";
  panel.innerHTML = `<p class="loading"><span class="spinner" aria-hidden="true"></span> Estimating ${what}` +
    " for seq " + button.dataset.seqLen + ", " + button.dataset.mode +
    "… (seconds for a small model, up to a minute for a large one)</p>";
  try {
    const response = await fetch(`${panel.dataset.url}?${params}`, { headers: { Accept: "text/html" } });
    const text = await response.text();
    if (!response.ok) throw new Error(errorText(text, response.status));
    panel.innerHTML = text;
    watchScrolls(panel);
  } catch (error) {
    panel.innerHTML = "";
    const p = document.createElement("p");
    p.className = "alert";
    p.setAttribute("role", "alert");
    p.textContent = `Could not explain this cell: ${error.message}`;
    panel.append(p);
  } finally {
    panel.removeAttribute("aria-busy");
    panel.scrollIntoView({ block: "nearest", behavior: "smooth" });
  }
}

function errorText(text, status) {
  try {
    const body = JSON.parse(text);
    if (typeof body.detail === "string") return body.detail;
  } catch (_) { /* not JSON */ }
  return `HTTP ${status}`;
}

// -- launch form ------------------------------------------------------------------------------

const FIELDS = ["model", "task", "dtype", "seq_lens", "modes", "gpu", "gpu_memory", "backend", "attn",
  "optimizer", "loss", "margin", "max_batch", "search", "peft", "lora_r", "lora_alpha", "lora_dropout",
  "lora_targets", "qlora_recipe", "gpus", "parallel", "nodes", "reshard_after_forward", "trainer",
  "precompute_ref_log_probs", "chosen_nll", "kto_loss_type", "num_generations", "max_completion_length",
  "beta", "steps_per_generation", "vllm_mode", "vllm_gpu_memory_utilization", "token"];

function decimalOr(text) {
  const trimmed = text.trim();
  return /^-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(trimmed) ? Number(trimmed) : trimmed;
}

function numberOr(text) {
  const trimmed = text.trim();
  return /^-?\d+$/.test(trimmed) ? Number(trimmed) : trimmed;
}

function formBody(form) {
  const data = new FormData(form);
  const body = { model: (data.get("model") || "").trim() };
  const seqLens = String(data.get("seq_lens") || "").split(/[\s,;]+/).filter(Boolean);
  if (seqLens.length) body.seq_lens = seqLens.map(numberOr);  // empty: the model's defaults
  const modes = data.getAll("modes");
  if (modes.length) body.modes = modes;  // none: the modes of the weights' dtype
  for (const name of ["task", "dtype", "gpu", "gpu_memory", "backend", "attn", "optimizer", "loss", "search"]) {
    const value = String(data.get(name) || "").trim();
    if (value) body[name] = value;
  }
  const margin = String(data.get("margin") || "").trim();
  if (margin) body.margin = /^[\d.]+$/.test(margin) ? Number(margin) : margin;
  const maxBatch = String(data.get("max_batch") || "").trim();
  if (maxBatch) body.max_batch = numberOr(maxBatch);
  // Fine-tuning: a full fine-tune sends none of it (the request of a table before PEFT was modelled);
  // a LoRA setting filled in without a method is sent, and the API says what it needs.
  const peft = String(data.get("peft") || "none");
  if (peft === "lora_8bit") {  // an 8-bit base is asked for as transformers does: load_in_8bit
    body.peft = "lora";
    body.load_in_8bit = true;
  } else if (peft !== "none") body.peft = peft;
  const rank = String(data.get("lora_r") || "").trim();
  if (rank) body.lora_r = numberOr(rank);
  for (const name of ["lora_alpha", "lora_dropout"]) {
    const value = String(data.get(name) || "").trim();
    if (value) body[name] = decimalOr(value);
  }
  const targets = String(data.get("lora_targets") || "").trim();
  if (targets) body.lora_targets = targets;
  const recipe = String(data.get("qlora_recipe") || "").trim();
  if (recipe) body.qlora_recipe = recipe;  // empty: the service's default
  // A multi-GPU job: one GPU sends none of it (the request of a table before jobs had more).
  for (const name of ["gpus", "nodes"]) {
    const value = String(data.get(name) || "").trim();
    if (value) body[name] = numberOr(value);
  }
  const parallel = String(data.get("parallel") || "").trim();
  if (parallel) body.parallel = parallel;
  if (data.get("keep_gathered")) body.reshard_after_forward = false;
  trainerBody(form, data, body);
  return body;
}

// The trainer: sft sends none of it (the request of a table before trainers were modelled); each
// other sends the settings shown for it (showTrainerFields), empty ones left to the service.
function trainerBody(form, data, body) {
  const trainer = String(data.get("trainer") || "sft");
  if (trainer !== "sft") body.trainer = trainer;
  const shown = (name) => !form.elements[name].closest("[data-trainers]").hidden;
  if (shown("precompute_ref_log_probs") && data.get("precompute_ref_log_probs")) {
    body.precompute_ref_log_probs = true;
  }
  if (shown("chosen_nll") && data.get("pure_simpo")) body.chosen_nll = false;  // CPOConfig cpo_alpha 0
  if (shown("kto_loss_type")) body.kto_loss_type = String(data.get("kto_loss_type"));
  for (const name of ["num_generations", "max_completion_length", "steps_per_generation"]) {
    const value = String(data.get(name) || "").trim();
    if (shown(name) && value) body[name] = numberOr(value);
  }
  for (const name of ["beta", "vllm_gpu_memory_utilization"]) {
    const value = String(data.get(name) || "").trim();
    if (shown(name) && value) body[name] = decimalOr(value);
  }
  const generation = String(data.get("vllm_mode") || "");
  if (shown("vllm_mode") && generation) {  // vLLM's engine, as GRPOConfig asks for it: use_vllm + vllm_mode
    body.use_vllm = true;
    body.vllm_mode = generation;
  }
}

// Each trainer's settings are shown with it only (data-trainers: the trainers they belong to), the
// vLLM engine's share only for a colocated engine (data-vllm-mode).
function showTrainerFields(form) {
  const trainer = form.elements.trainer.value;
  const generation = form.elements.vllm_mode.value;
  for (const element of form.querySelectorAll("[data-trainers]")) {
    const mode = element.dataset.vllmMode;  // shown with this generation only
    const applies = element.dataset.trainers.split(" ").includes(trainer);
    element.hidden = !applies || Boolean(mode && mode !== generation);
  }
}

function clearErrors(form) {
  for (const name of FIELDS) setFieldError(form, name, null);
  const general = document.getElementById("form-error");
  general.hidden = true;
  general.textContent = "";
}

function setFieldError(form, name, message) {
  const slot = document.getElementById(`${name}-error`);
  if (!slot) return false;
  slot.hidden = !message;
  slot.textContent = message || "";
  const inputs = name === "modes" ? form.querySelectorAll("input[name=modes]") : [form.elements[name]];
  for (const input of inputs) {
    if (!input) continue;
    if (message) input.setAttribute("aria-invalid", "true");
    else input.removeAttribute("aria-invalid");
  }
  return true;
}

// The API answers errors as {"detail": "...", "field": "seq_lens"} (the core's checks) or as
// pydantic's list [{"loc": ["body", "seq_lens", 0], "msg": "..."}] (the request's shape).
function fieldErrors(status, body) {
  if (Array.isArray(body.detail)) {
    return body.detail.map((item) => {
      const loc = (item.loc || []).filter((part) => part !== "body");
      const field = typeof loc[0] === "string" ? loc[0] : null;
      const where = loc.length > 1 ? ` (item ${Number(loc[1]) + 1})` : "";
      return { field, message: `${item.msg}${where}` };
    });
  }
  if (Array.isArray(body.errors) && body.errors.length) {
    // The core's checks list every invalid field, the first also in detail/field; a long message
    // (an unknown model's lists every preset) also in one line, its brief, shown instead.
    return body.errors.map((item) => ({ field: item.field || null, message: item.brief || item.detail }));
  }
  const message = typeof body.detail === "string" ? body.detail : `HTTP ${status}`;
  const field = body.field || (status === 401 ? "token" : (status === 403 ? "model" : null));
  return [{ field, message }];
}

async function submitLaunch(event) {
  const form = event.currentTarget;
  event.preventDefault();
  clearErrors(form);
  const status = document.getElementById("launch-status");
  const submit = document.getElementById("launch-submit");
  const headers = { "Content-Type": "application/json", Accept: "application/json" };
  const token = form.elements.token ? form.elements.token.value.trim() : "";
  if (token) {
    headers.Authorization = `Bearer ${token}`;
    sessionStorage.setItem("autotune-token", token);
  }
  // "All kinds in the fleet": one run per GPU kind, through the fleet's route, which sets each gpu.
  const allKinds = Boolean(form.elements.gpu) && form.elements.gpu.value === form.dataset.allKinds;
  const request = formBody(form);
  if (allKinds) delete request.gpu;
  submit.disabled = true;
  status.textContent = "Checking the request…";
  let response;
  let body = {};
  try {
    const action = allKinds ? form.dataset.fleetAction : form.action;
    response = await fetch(action, { method: "POST", headers, body: JSON.stringify(request) });
    body = await response.json().catch(() => ({}));
  } catch (error) {
    status.textContent = "";
    submit.disabled = false;
    const general = document.getElementById("form-error");
    general.textContent = `The server did not answer: ${error.message}`;
    general.hidden = false;
    return;
  }
  if (response.ok && allKinds) {
    status.textContent = `Queued on ${body.kinds.join(", ")}; opening the fleet view…`;
    const params = new URLSearchParams({ model: body.model, step: body.step });
    window.location.assign(`${form.dataset.fleetUrl}?${params}`);
    return;
  }
  if (response.ok) {
    status.textContent = body.created ? "Queued; opening the run…" : "An identical run exists; opening it…";
    window.location.assign(form.dataset.runUrl.replace("RUN_ID", encodeURIComponent(body.id)));
    return;
  }
  status.textContent = "";
  submit.disabled = false;
  let first = null;
  const general = [];
  for (const { field, message } of fieldErrors(response.status, body)) {
    if (field && setFieldError(form, field, message)) {
      first = first || field;
    } else {
      general.push(message);
    }
  }
  if (general.length) {
    const slot = document.getElementById("form-error");
    slot.textContent = general.join("; ");
    slot.hidden = false;
  }
  const target = first === "modes" ? form.querySelector("input[name=modes]") : form.elements[first];
  if (target && target.focus) target.focus();
}

// -- wiring -----------------------------------------------------------------------------------------

document.addEventListener("click", (event) => {
  const cell = event.target.closest(".cell-button");
  if (cell) {
    selectCell(cell.dataset.cell);
    return;
  }
  const explain = event.target.closest(".explain-button");
  if (explain) loadExplain(explain);
});

document.addEventListener("DOMContentLoaded", () => {
  watchScrolls(document);
  for (const element of document.querySelectorAll("[data-live]")) startLive(element);
  const key = selectedCell();
  if (key) selectCell(key);
  const form = document.getElementById("launch-form");
  if (form) {
    form.addEventListener("submit", submitLaunch);
    showTrainerFields(form);  // the browser may have restored a trainer chosen before
    for (const name of ["trainer", "vllm_mode"]) {
      form.elements[name].addEventListener("change", () => showTrainerFields(form));
    }
    const token = sessionStorage.getItem("autotune-token");
    if (token && form.elements.token) form.elements.token.value = token;
  }
  const compare = document.getElementById("compare-form");
  if (compare) {
    compare.addEventListener("submit", (event) => {
      if (!compare.querySelector("input[name=id]:checked")) {
        event.preventDefault();
        const hint = compare.querySelector(".hint");
        if (hint) hint.textContent = "Tick at least one run first (two or more to compare them).";
      }
    });
  }
});
