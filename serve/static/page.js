// The upload form (serve/templates/index.html), enhanced: drop files anywhere on the page, paste
// images, see thumbnails and remove files before sending, then get the results in place from
// /api/v1/predict, sent in batches within the server's limits, with progress.
//
// Without this script, or in a browser without what it needs, the form posts to / and the server
// renders the results page; the script falls back to exactly that when the API turns it away (an
// API key the page does not have). Server data reaches the page through textContent and
// setAttribute only, never as HTML; the page's CSP allows no inline script.
"use strict";

(() => {
  const form = document.getElementById("upload");
  if (!form || !window.fetch || !window.DataTransfer || !window.FormData || !window.URL) return;

  /** Files a request carries at most, so that many files show progress (the server's cap may be lower). */
  const BATCH_FILES = 8;
  /** Bytes counted for each multipart part's headers, so that a batch stays under the body cap. */
  const PART_OVERHEAD = 1024;
  const WORDS = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"];

  const input = form.querySelector("input[type=file]");
  const drop = document.getElementById("drop");
  const list = document.getElementById("chosen");
  const button = form.querySelector("button[type=submit]");
  const sending = document.getElementById("sending");
  const progress = document.getElementById("progress");
  const status = document.getElementById("status");
  const results = document.getElementById("results");
  const data = form.dataset;
  const limits = {
    notSureBelow: Number(data.notSureBelow),
    images: Math.max(1, Math.min(BATCH_FILES, Number(data.maxImages) || 1)),
    bytes: Number(data.maxBytes) || Infinity,
    pixels: Number(data.maxPixels) || Infinity,
    imagePixels: Number(data.maxImagePixels) || Infinity,
  };

  let chosen = []; // {file, url, item, measured: Promise, pixels}
  let shown = []; // entries whose thumbnails the results show
  let busy = false;
  let classCount = null; // a Promise of the words for the model's class count

  document.getElementById("drop-hint").hidden = false;

  // -- choosing ---------------------------------------------------------------------------

  function el(tag, attributes = {}, text) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  /** The file input holds every chosen file, so the form itself can post them (the fallback). */
  function syncInput() {
    const transfer = new DataTransfer();
    for (const entry of chosen) transfer.items.add(entry.file);
    input.files = transfer.files;
    list.hidden = chosen.length === 0;
  }

  function sameFile(a, b) {
    return a.name === b.name && a.size === b.size && a.lastModified === b.lastModified && a.type === b.type;
  }

  function add(files) {
    let added = 0;
    for (const file of files) {
      if (chosen.some((entry) => sameFile(entry.file, file))) continue;
      chosen.push(thumbnail(file));
      added += 1;
    }
    syncInput();
    if (added) say(`${chosen.length} ${plural(chosen.length, "image")} chosen.`);
  }

  function thumbnail(file) {
    const entry = { file, url: URL.createObjectURL(file), pixels: 0 };
    const item = el("li");
    const img = el("img", { src: entry.url, alt: "" });
    const name = el("span", { class: "name" }, file.name);
    const remove = el("button", { type: "button", class: "remove", "aria-label": `Remove ${file.name}` }, "Remove");
    remove.addEventListener("click", () => removeEntry(entry));
    item.append(img, name, remove);
    list.append(item);
    entry.item = item;
    // The pixels it declares, so that a batch stays under the server's pixel budget; 0 when it is not
    // an image the browser reads (the server refuses it on its own, as it counts it for nothing).
    entry.measured = img.decode().then(
      () => { entry.pixels = img.naturalWidth * img.naturalHeight; },
      () => { entry.pixels = 0; item.classList.add("unreadable"); },
    );
    return entry;
  }

  function removeEntry(entry) {
    const index = chosen.indexOf(entry);
    if (index < 0 || busy) return;
    chosen.splice(index, 1);
    entry.item.remove();
    if (!shown.includes(entry)) URL.revokeObjectURL(entry.url);
    syncInput();
    const next = chosen[index] || chosen[index - 1];
    (next ? next.item.querySelector("button") : input).focus();
    say(`${entry.file.name} removed; ${chosen.length} ${plural(chosen.length, "image")} chosen.`);
  }

  input.addEventListener("change", () => {
    // The browser has replaced the input's files with the new choice: add them to the others.
    add(Array.from(input.files));
  });

  const hasFiles = (event) => event.dataTransfer && Array.from(event.dataTransfer.types).includes("Files");
  document.addEventListener("dragover", (event) => {
    if (!hasFiles(event)) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = "copy";
    drop.classList.add("over");
  });
  document.addEventListener("dragleave", (event) => {
    if (!event.relatedTarget) drop.classList.remove("over"); // left the window
  });
  document.addEventListener("drop", (event) => {
    drop.classList.remove("over");
    if (!hasFiles(event)) return;
    event.preventDefault(); // or the browser opens the file in place of the page
    if (!busy) add(Array.from(event.dataTransfer.files));
  });
  document.addEventListener("paste", (event) => {
    const files = event.clipboardData ? Array.from(event.clipboardData.files) : [];
    if (!files.length || busy) return; // text pastes into the number field as usual
    event.preventDefault();
    add(files);
  });

  // -- sending ----------------------------------------------------------------------------

  function plural(n, word) {
    return n === 1 ? word : `${word}s`;
  }

  function say(text) {
    status.textContent = text;
  }

  /** The entries in requests within the server's caps on images, bytes and pixels, in order. */
  function batches(entries) {
    const out = [];
    let batch = [];
    let bytes = 0;
    let pixels = 0;
    for (const entry of entries) {
      const size = entry.file.size + PART_OVERHEAD;
      const declared = entry.pixels <= limits.imagePixels ? entry.pixels : 0;
      if (batch.length && (batch.length >= limits.images || bytes + size > limits.bytes || pixels + declared > limits.pixels)) {
        out.push(batch);
        batch = [];
        bytes = 0;
        pixels = 0;
      }
      batch.push(entry);
      bytes += size;
      pixels += declared;
    }
    if (batch.length) out.push(batch);
    return out;
  }

  /** One batch to the API: {answer}, {error, fatal} or {unauthorized}. */
  async function send(batch) {
    const body = new FormData();
    for (const entry of batch) body.append("file", entry.file, entry.file.name);
    body.append("top_k", form.elements.top_k.value);
    let response;
    try {
      response = await fetch(data.api, { method: "POST", body, headers: { Accept: "application/json" }, credentials: "same-origin" });
    } catch (e) {
      const error = "The server cannot be reached; check the connection and try again.";
      return { error, fatal: true };
    }
    if (response.status === 401) return { unauthorized: true };
    let answer = null;
    try {
      answer = await response.json();
    } catch (e) {
      // not JSON: a proxy's error page
    }
    if (answer && Array.isArray(answer.predictions) && answer.predictions.length === batch.length) return { answer };
    const error = answer && typeof answer.error === "string" ? answer.error : `the server answered ${response.status} ${response.statusText}`.trim();
    return { error, fatal: response.status === 429 || response.status >= 500 };
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (busy) return;
    if (!chosen.length) {
      clearResults();
      results.append(el("p", { class: "error", role: "alert" }, "Choose one or more image files first."));
      input.focus();
      return;
    }
    busy = true;
    button.disabled = true;
    results.setAttribute("aria-busy", "true");
    clearResults();
    const entries = chosen.slice();
    const total = entries.length;
    await Promise.all(entries.map((entry) => entry.measured));
    progress.max = total;
    progress.value = 0;
    sending.hidden = false;
    say(`Sending ${total} ${plural(total, "image")}…`);
    let done = 0;
    let answered = 0;
    let refused = 0;
    let stopped = null;
    for (const batch of batches(entries)) {
      const outcome = await send(batch);
      if (outcome.unauthorized) {
        say("Sending the form…");
        form.submit(); // the form's own route, which the browser's credentials open
        return;
      }
      if (outcome.answer) {
        const counts = await show(outcome.answer, batch);
        answered += counts.answered;
        refused += counts.refused;
        chosen = chosen.filter((entry) => !batch.includes(entry));
        for (const entry of batch) {
          entry.item.remove();
          if (!shown.includes(entry)) URL.revokeObjectURL(entry.url); // refused: the results show no image
        }
      } else {
        const names = batch.map((entry) => entry.file.name).join(", ");
        results.append(el("p", { class: "error", role: "alert", "data-testid": "batch-error" }, `Not classified (${names}): ${outcome.error}`));
      }
      done += batch.length;
      progress.value = done;
      say(`Classified ${answered} of ${total} ${plural(total, "image")}…`);
      if (outcome.fatal) {
        stopped = outcome.error;
        break;
      }
    }
    syncInput();
    const summary = `${answered} of ${total} ${plural(total, "image")} classified` + (refused ? `, ${refused} refused` : "");
    say(stopped ? `Stopped: ${summary}. The others are still chosen: try again.` : `Done: ${summary}.`);
    results.setAttribute("aria-busy", "false");
    button.disabled = false;
    busy = false;
  });

  function clearResults() {
    for (const entry of shown) if (!chosen.includes(entry)) URL.revokeObjectURL(entry.url);
    shown = [];
    results.replaceChildren();
  }

  // -- results, as serve/templates/index.html renders them ---------------------------------

  async function show(answer, batch) {
    if (!results.querySelector("h2")) {
      const heading = el("h2", {}, "Results");
      const model = answer.model || {};
      if (model.name) {
        const about = `${model.name} v${model.version}` + (model.architecture ? `, ${model.architecture}` : "");
        heading.append(" ", el("small", {}, `(${about})`));
      }
      results.append(heading);
    }
    const foreign = answer.predictions.some((p) => p.in_distribution === false);
    const count = foreign ? await classCountWords() : "";
    let answeredHere = 0;
    answer.predictions.forEach((prediction, i) => {
      results.append(result(prediction, batch[i], count));
      if (prediction.error) return;
      answeredHere += 1;
      shown.push(batch[i]);
    });
    return { answered: answeredHere, refused: batch.length - answeredHere };
  }

  function result(p, entry, count) {
    const box = el("div", { class: "result" });
    const bars = el("div", { class: "bars" });
    const name = p.filename || entry.file.name;
    if (!p.error) box.append(el("img", { src: entry.url, alt: name }));
    box.append(bars);
    bars.append(el("div", { class: "filename" }, name));
    if (p.error) {
      bars.append(el("p", { class: "error", role: "alert" }, p.error));
      return box;
    }
    const top = p.top_k || [];
    if (p.in_distribution === false) {
      bars.append(el("div", { class: "label foreign", "data-testid": "verdict" }, `none of the ${count} classes`));
      const score = typeof p.ood_score === "number" ? p.ood_score.toFixed(2) : "?";
      bars.append(el("p", { class: "note", "data-testid": "ood-note" },
        `This image looks like none of the classes the model knows (score ${score}); its closest guesses:`));
    } else if (p.probability < limits.notSureBelow && top.length) {
      const words = `not sure: ${top[0].label}` + (top.length > 1 ? ` or ${top[1].label}` : "");
      bars.append(el("div", { class: "label unsure", "data-testid": "not-sure" }, words));
    } else {
      bars.append(el("div", { class: "label", "data-testid": "label" }, p.label));
    }
    for (const t of top) {
      const bar = el("div", { class: p.in_distribution === false ? "bar guess" : "bar" });
      const percent = `${(t.probability * 100).toFixed(1)}%`;
      bar.append(
        el("span", { class: "name" }, t.label),
        el("meter", { class: "fill", min: "0", max: "1", value: t.probability.toFixed(4) }, percent),
        el("span", { class: "pct" }, percent),
      );
      bars.append(bar);
    }
    return box;
  }

  /** "ten" for a model of ten classes, as the results page words it; "known" when the model does not say. */
  function classCountWords() {
    if (!classCount) {
      classCount = fetch(data.modelApi, { headers: { Accept: "application/json" }, credentials: "same-origin" })
        .then((response) => (response.ok ? response.json() : {}))
        .then((model) => {
          const n = Array.isArray(model.class_names) ? model.class_names.length : 0;
          return n ? (WORDS[n] || String(n)) : "known";
        })
        .catch(() => "known");
    }
    return classCount;
  }
})();
