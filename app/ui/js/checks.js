// Conformance in the browser: a run of the suite (POST /ors/checks) against this server or
// an API root the operator allows, its checks shown as they finish (the run's SSE
// events), then the report the CLI's --html writes, shown in a sandboxed frame (no
// script runs in it), and both reports to download.

import { json, request, sse } from "./api.js";
import { $, append, clear, download, errorBox, h, hideError } from "./dom.js";

export class Checks {
  constructor() {
    this.run = null;
    $("#check-url").value = `${location.origin}/v1`;
    $("#check-form").addEventListener("submit", (event) => { event.preventDefault(); this.start(); });
    $("#check-open").addEventListener("click", () => this.open());
    $("#check-download-json").addEventListener("click", () => this.save("json"));
    $("#check-download-html").addEventListener("click", () => this.save("html"));
  }

  buttons(enabled) {
    for (const id of ["#check-open", "#check-download-json", "#check-download-html"]) $(id).disabled = !enabled;
  }

  async start() {
    hideError($("#check-error"));
    clear($("#check-results"));
    this.buttons(false);
    $("#check-report").hidden = true;
    $("#check-run").disabled = true;
    const body = { base_url: $("#check-url").value.trim(), model: $("#check-model").value,
      concurrent: $("#check-concurrent").checked };
    const key = $("#check-key").value;
    if (key) body.api_key = key;
    try {
      this.run = await json("/ors/checks", { method: "POST", body });
      $("#check-summary").textContent = `Running ${this.run.total} checks against ${this.run.endpoint}…`;
      const reply = await request(`/ors/checks/${this.run.id}/events`);
      for await (const { event, data } of sse(reply)) {
        const payload = JSON.parse(data);
        if (event === "check") this.row(payload);
        if (event === "done") {
          $("#check-summary").textContent = `${payload.conformant ? "Conformant" : "Not conformant"}: `
            + `${payload.passed} passed, ${payload.failed} failed, ${payload.skipped} skipped.`;
          $("#check-summary").dataset.conformant = String(payload.conformant);
          this.buttons(true);
          break;
        }
      }
    } catch (error) {
      errorBox($("#check-error"), error.error ?? { message: String(error) }, error.status);
    } finally {
      $("#check-run").disabled = false;
    }
  }

  row(check) {
    append($("#check-results"), h("tr", { className: "check-row", dataset: { name: check.name, status: check.status } },
      h("td", {}, check.name), h("td", { className: check.status }, check.status),
      h("td", {}, Number(check.seconds).toFixed(1)), h("td", {}, (check.reason ?? "").split("\n")[0])));
  }

  async report(kind) {
    return (await request(`/ors/checks/${this.run.id}/report.${kind}`)).text();
  }

  async open() {
    try {
      const frame = $("#check-report");
      frame.srcdoc = await this.report("html");
      frame.hidden = false;
    } catch (error) {
      errorBox($("#check-error"), error.error, error.status);
    }
  }

  async save(kind) {
    try {
      download(`ors-check-${this.run.id}.${kind}`, await this.report(kind),
        kind === "json" ? "application/json" : "text/html");
    } catch (error) {
      errorBox($("#check-error"), error.error, error.status);
    }
  }
}
