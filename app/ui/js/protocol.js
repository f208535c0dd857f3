// The protocol made visible: one response's items as cards whose status changes as the
// events say, the event timeline, and the response's figures (status, time to first
// token, usage, cached tokens). Fed event by event, live or replayed.

import { append, clear, h, pretty } from "./dom.js";

const DELTA = /\.delta$/;

/** Text shown on an item's card for an item of the response's output. */
function itemText(item) {
  switch (item.type) {
    case "message":
      return (item.content ?? []).map((part) => part.text ?? part.refusal ?? "").join("");
    case "reasoning":
      return [...(item.summary ?? []), ...(item.content ?? [])].map((part) => part.text ?? "").join("\n");
    case "function_call":
      return `${item.name}(${item.arguments ?? ""})`;
    case "function_call_output":
      return typeof item.output === "string" ? item.output : pretty(item.output);
    case "custom_tool_call":
      return `${item.name}: ${item.input ?? ""}`;
    default:
      return pretty(item);
  }
}

export class ProtocolView {
  /** `targets`: {items, timeline, stats} elements to fill. */
  constructor(targets) {
    this.targets = targets;
    this.reset();
  }

  reset() {
    this.started = performance.now();
    this.firstToken = null;
    this.cards = new Map(); // output_index -> {card, status, body}
    this.response = null;
    clear(this.targets.items);
    clear(this.targets.timeline);
    clear(this.targets.stats);
  }

  /** One event of the response, in order. */
  event(event) {
    const at = performance.now() - this.started;
    this.timeline(event, at);
    if (DELTA.test(event.type) && this.firstToken === null) this.firstToken = at;
    if (event.response) this.response = event.response;
    switch (event.type) {
      case "response.output_item.added":
        this.card(event.output_index, event.item);
        break;
      case "response.output_item.done":
        this.card(event.output_index, event.item).body.textContent = itemText(event.item);
        break;
      case "response.output_text.delta":
      case "response.reasoning.delta":
      case "response.reasoning_text.delta":
      case "response.reasoning_summary_text.delta":
      case "response.function_call_arguments.delta":
      case "response.custom_tool_call_input.delta":
        this.cards.get(event.output_index)?.body.append(event.delta);
        break;
      default:
        break;
    }
    this.stats();
  }

  card(index, item) {
    let entry = this.cards.get(index);
    if (!entry) {
      const status = h("span", { className: "status" });
      const body = h("div", { className: "body" });
      const card = h("div", { className: "item-card" },
        h("div", { className: "head" }, h("span", { className: "type" }, item.type), status), body);
      if (item.type === "function_call") body.append(`${item.name}(`);
      this.targets.items.append(card);
      entry = { card, status, body };
      this.cards.set(index, entry);
    }
    const status = item.status ?? "completed";
    entry.card.dataset.type = item.type;
    entry.card.dataset.status = status;
    entry.card.dataset.id = item.id ?? "";
    entry.status.textContent = status;
    return entry;
  }

  timeline(event, at) {
    const payload = h("pre", { hidden: true }, pretty(event));
    const row = h("li", { className: "event-row", dataset: { type: event.type } },
      h("span", { className: "seq" }, event.sequence_number ?? ""),
      h("span", { className: "name" }, event.type),
      h("span", { className: "at" }, `${(at / 1000).toFixed(3)} s`),
      payload);
    row.addEventListener("click", () => { payload.hidden = !payload.hidden; });
    this.targets.timeline.append(row);
  }

  stats() {
    const response = this.response;
    if (!response) return;
    const usage = response.usage;
    const rows = [
      ["id", response.id],
      ["status", response.status],
      ["model", response.model],
      ["time to first token", this.firstToken === null ? "–" : `${(this.firstToken / 1000).toFixed(3)} s`],
      ["input tokens", usage?.input_tokens ?? "–"],
      ["cached tokens", usage?.input_tokens_details?.cached_tokens ?? "–"],
      ["output tokens", usage?.output_tokens ?? "–"],
      ["reasoning tokens", usage?.output_tokens_details?.reasoning_tokens ?? "–"],
    ];
    if (response.incomplete_details) rows.push(["incomplete", response.incomplete_details.reason]);
    if (response.error) rows.push(["error", `${response.error.code}: ${response.error.message}`]);
    clear(this.targets.stats);
    for (const [name, value] of rows) {
      append(this.targets.stats, h("dt", {}, name), h("dd", { dataset: { stat: name } }, String(value)));
    }
  }
}

export { itemText };
