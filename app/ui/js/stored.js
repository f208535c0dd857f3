// Stored responses: the tenant's list (GET /v1/responses, newest first, a page at a time);
// one opened: its chain up previous_response_id, its input items, its output, a replay of
// its events, delete, or continue it in the chat.

import { json, replay, request } from "./api.js";
import { $, append, clear, errorBox, h, hideError } from "./dom.js";
import { itemText, ProtocolView } from "./protocol.js";

const PAGE = 20;
const CHAIN_SHOWN = 50;

function firstWords(response) {
  for (const item of response.output ?? []) {
    const text = itemText(item);
    if (text) return text.length > 60 ? `${text.slice(0, 60)}…` : text;
  }
  return "";
}

function itemCard(item) {
  const role = item.role ? ` (${item.role})` : "";
  const text = item.type === "message" && typeof item.content !== "string"
    ? (item.content ?? []).map((part) => part.text ?? part.refusal ?? `[${part.type}]`).join("")
    : (typeof item.content === "string" ? item.content : itemText(item));
  return h("div", { className: "item-card", dataset: { type: item.type, status: item.status ?? "completed" } },
    h("div", { className: "head" }, h("span", { className: "type" }, `${item.type}${role}`),
      h("span", { className: "status" }, item.status ?? "")),
    h("div", { className: "body" }, text));
}

export class Stored {
  /** `continueInChat(id)` is called by "Continue in chat". */
  constructor(continueInChat) {
    this.continueInChat = continueInChat;
    this.after = null;
    this.current = null;
    this.view = new ProtocolView({ items: $("#replay-items"), timeline: $("#replay-timeline"), stats: $("#replay-stats") });
    $("#stored-refresh").addEventListener("click", () => this.load(true));
    $("#stored-order").addEventListener("change", () => this.load(true));
    $("#stored-more").addEventListener("click", () => this.load(false));
    $("#replay").addEventListener("click", () => this.replay());
    $("#stored-delete").addEventListener("click", () => this.remove());
    $("#stored-continue").addEventListener("click", () => this.current && this.continueInChat(this.current.id));
  }

  async load(fresh) {
    hideError($("#stored-error"));
    if (fresh) {
      this.after = null;
      clear($("#stored-list"));
    }
    const query = new URLSearchParams({ limit: String(PAGE), order: $("#stored-order").value });
    if (this.after) query.set("after", this.after);
    let page;
    try {
      page = await json(`/v1/responses?${query}`);
    } catch (error) {
      $("#stored-detail").hidden = false;
      errorBox($("#stored-error"), error.error, error.status);
      return;
    }
    for (const response of page.data) {
      const row = h("tr", { className: "stored-row", dataset: { id: response.id } },
        h("td", {}, h("code", {}, response.id)), h("td", {}, response.model), h("td", {}, response.status),
        h("td", {}, new Date(response.created_at * 1000).toLocaleString()), h("td", {}, firstWords(response)));
      row.addEventListener("click", () => this.open(response.id));
      $("#stored-list").append(row);
    }
    this.after = page.last_id ?? this.after;
    $("#stored-more").hidden = !page.has_more;
  }

  async open(id) {
    hideError($("#stored-error"));
    for (const row of document.querySelectorAll(".stored-row")) row.classList.toggle("selected", row.dataset.id === id);
    $("#stored-detail").hidden = false;
    clear($("#chain"));
    clear($("#input-items"));
    this.view.reset();
    try {
      const response = await json(`/v1/responses/${encodeURIComponent(id)}`);
      this.current = response;
      $("#stored-title").textContent = `${response.id} · ${response.status}`;
      for (const item of response.output) $("#replay-items").append(itemCard(item));
      await this.chain(response);
      const inputs = await json(`/v1/responses/${encodeURIComponent(id)}/input_items?order=asc&limit=100`);
      for (const item of inputs.data) $("#input-items").append(itemCard(item));
      if (inputs.has_more) append($("#input-items"), h("p", { className: "meta" }, "(the first 100 shown)"));
    } catch (error) {
      errorBox($("#stored-error"), error.error, error.status);
    }
  }

  /** The chain, this response first, up previous_response_id. */
  async chain(response) {
    let link = response;
    for (let shown = 0; link && shown < CHAIN_SHOWN; shown += 1) {
      const id = link.id;
      const entry = h("li", { className: "chain-link", dataset: { id } }, h("code", {}, id), ` ${link.status} `,
        firstWords(link));
      entry.addEventListener("click", () => this.open(id));
      $("#chain").append(entry);
      if (!link.previous_response_id) return;
      try {
        link = await json(`/v1/responses/${encodeURIComponent(link.previous_response_id)}`);
      } catch {
        append($("#chain"), h("li", { className: "chain-link" }, h("code", {}, link.previous_response_id), " (deleted)"));
        return;
      }
    }
  }

  async replay() {
    if (!this.current) return;
    hideError($("#stored-error"));
    this.view.reset();
    try {
      await replay(this.current.id, (event) => this.view.event(event));
    } catch (error) {
      errorBox($("#stored-error"), error.error, error.status);
    }
  }

  async remove() {
    if (!this.current) return;
    const id = this.current.id;
    try {
      await request(`/v1/responses/${encodeURIComponent(id)}`, { method: "DELETE" });
    } catch (error) {
      errorBox($("#stored-error"), error.error, error.status);
      return;
    }
    document.querySelector(`.stored-row[data-id="${CSS.escape(id)}"]`)?.remove();
    this.current = null;
    $("#stored-detail").hidden = true;
  }
}
