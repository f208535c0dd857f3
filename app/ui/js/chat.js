// The chat: a request built from the settings, streamed over HTTP or WebSocket, the answer
// written into the transcript as it comes, function calls answered from the page, and the
// conversation continued with previous_response_id (or, for responses not stored and sent
// over HTTP, by sending the whole conversation again).

import { ApiError, streamHttp, streamSocket } from "./api.js";
import { $, append, errorBox, h, hideError, pretty } from "./dom.js";
import { ProtocolView } from "./protocol.js";

const EXAMPLES = {
  none: [],
  weather: [{
    type: "function", name: "get_weather", description: "Get the current weather in a city.", strict: true,
    parameters: {
      type: "object", properties: { city: { type: "string", description: "The city's name." } },
      required: ["city"], additionalProperties: false,
    },
  }],
  two: [
    {
      type: "function", name: "get_weather", description: "Get the current weather in a city.",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    },
    {
      type: "function", name: "get_time", description: "Get the current time in a time zone.",
      parameters: { type: "object", properties: { zone: { type: "string" } }, required: ["zone"] },
    },
  ],
};

const SCHEMA = {
  name: "answer", strict: true,
  schema: { type: "object", properties: { answer: { type: "string" } }, required: ["answer"], additionalProperties: false },
};

class SettingsError extends ApiError {
  constructor(param, message) {
    super(400, { type: "invalid_request_error", code: "invalid_json", param, message });
  }
}

function parseJson(id, param) {
  try {
    return JSON.parse($(id).value);
  } catch (error) {
    throw new SettingsError(param, `${param} is not valid JSON: ${error.message}`);
  }
}

export class Chat {
  constructor() {
    this.view = new ProtocolView({ items: $("#items"), timeline: $("#timeline"), stats: $("#stats") });
    this.previousId = null;
    this.history = []; // the conversation's items, for continuing unstored responses over HTTP
    this.controller = null;
    $("#composer").addEventListener("submit", (event) => { event.preventDefault(); this.sendMessage(); });
    $("#message").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); this.sendMessage(); }
    });
    $("#stop").addEventListener("click", () => this.controller?.abort());
    $("#new-conversation").addEventListener("click", () => this.startOver());
    $("#tool-example").addEventListener("change", (event) => {
      if (event.target.value in EXAMPLES) $("#tools").value = pretty(EXAMPLES[event.target.value]);
      event.target.value = "";
      this.toolChoices();
    });
    $("#tools").addEventListener("input", () => this.toolChoices());
    $("#format").addEventListener("change", () => {
      const schema = $("#format").value === "json_schema";
      $("#schema").hidden = !schema;
      if (schema && !$("#schema").value) $("#schema").value = pretty(SCHEMA);
    });
    this.toolChoices();
  }

  /** tool_choice's options: auto, none, required, and each function of the tools. */
  toolChoices() {
    const select = $("#tool-choice");
    const chosen = select.value;
    let names = [];
    try {
      names = JSON.parse($("#tools").value).filter((tool) => tool.type === "function").map((tool) => tool.name);
    } catch {
      names = [];
    }
    select.replaceChildren(...["auto", "none", "required"].map((value) => h("option", { value }, value)),
      ...names.map((name) => h("option", { value: `function:${name}` }, `function: ${name}`)));
    if ([...select.options].some((option) => option.value === chosen)) select.value = chosen;
  }

  startOver() {
    this.previousId = null;
    this.history = [];
    $("#previous-id").textContent = "(none)";
    $("#transcript").replaceChildren();
    this.view.reset();
    hideError($("#error"));
  }

  continueFrom(id) {
    this.startOver();
    this.previousId = id;
    $("#previous-id").textContent = id;
    append($("#transcript"), h("div", { className: "msg note" }, `Continuing from ${id}`));
  }

  sendMessage() {
    const text = $("#message").value;
    if (!text.trim() || this.controller) return;
    $("#message").value = "";
    append($("#transcript"), h("div", { className: "msg user" }, text));
    this.run([{ type: "message", role: "user", content: text }]);
  }

  body(input) {
    const transport = $("#transport").value;
    const store = $("#store").checked;
    const body = { model: $("#model").value, store };
    const instructions = $("#instructions").value.trim();
    if (instructions) body.instructions = instructions;
    const tools = parseJson("#tools", "tools");
    if (tools.length) body.tools = tools;
    const choice = $("#tool-choice").value;
    if (choice.startsWith("function:")) body.tool_choice = { type: "function", name: choice.slice(9) };
    else if (choice !== "auto") body.tool_choice = choice;
    const format = $("#format").value;
    if (format === "json_object") body.text = { format: { type: "json_object" } };
    if (format === "json_schema") body.text = { format: { type: "json_schema", ...parseJson("#schema", "text.format") } };
    const temperature = $("#temperature").value;
    if (temperature !== "") body.temperature = Number(temperature);
    const budget = $("#max-tokens").value;
    if (budget !== "") body.max_output_tokens = Number(budget);
    const chained = $("#continue").checked;
    if (chained && this.previousId && (store || transport === "ws")) {
      body.previous_response_id = this.previousId;
      body.input = input;
    } else {
      body.input = chained ? [...this.history, ...input] : input;
    }
    return body;
  }

  async run(input) {
    hideError($("#error"));
    let body;
    try {
      body = this.body(input);
    } catch (error) {
      errorBox($("#error"), error.error, error.status);
      return;
    }
    this.view.reset();
    this.controller = new AbortController();
    $("#send").disabled = true;
    $("#stop").disabled = false;
    const bubbles = new Map(); // output_index -> transcript element
    let final = null;
    const onEvent = (event) => {
      this.view.event(event);
      if (event.type === "response.output_item.added" && ["message", "reasoning"].includes(event.item.type)) {
        const bubble = h("div", { className: `msg ${event.item.type === "message" ? "assistant" : "reasoning"}` });
        bubbles.set(event.output_index, bubble);
        $("#transcript").append(bubble);
      } else if (/(output_text|reasoning|reasoning_text|reasoning_summary_text)\.delta$/.test(event.type)) {
        bubbles.get(event.output_index)?.append(event.delta);
      } else if (event.type === "error") {
        errorBox($("#error"), event.error ?? event, event.status);
      }
      if (["response.completed", "response.incomplete", "response.failed"].includes(event.type)) final = event.response;
      $("#transcript").scrollTop = $("#transcript").scrollHeight;
    };
    try {
      const stream = $("#transport").value === "ws" ? streamSocket : streamHttp;
      await stream(body, onEvent, this.controller.signal);
    } catch (error) {
      if (error.name === "AbortError") append($("#transcript"), h("div", { className: "msg note" }, "Stopped."));
      else errorBox($("#error"), error.error ?? { message: String(error) }, error.status);
    } finally {
      this.controller = null;
      $("#send").disabled = false;
      $("#stop").disabled = true;
    }
    if (!final) return;
    if (final.status === "failed" && final.error) errorBox($("#error"), final.error, "");
    this.previousId = final.id;
    $("#previous-id").textContent = final.id;
    this.history = [...(Array.isArray(body.input) && !body.previous_response_id ? body.input : [...this.history, ...input]),
      ...final.output.filter((item) => item.type !== "reasoning")];
    const calls = final.output.filter((item) => item.type === "function_call");
    if (calls.length) this.askForOutputs(calls);
  }

  /** The model called functions: the user answers each, then the conversation goes on. */
  askForOutputs(calls) {
    const answers = calls.map((call) => ({
      call, field: h("textarea", { className: "call-output", rows: 2, placeholder: "what the function returned" }),
    }));
    const send = h("button", { type: "button", className: "call-answer" }, "Send the output");
    const card = h("div", { className: "call" },
      ...answers.map(({ call, field }) => h("div", { dataset: { callId: call.call_id } },
        h("strong", {}, `${call.name} `), h("pre", {}, call.arguments), field)),
      send);
    send.addEventListener("click", () => {
      send.disabled = true;
      for (const { field } of answers) field.readOnly = true;
      this.run(answers.map(({ call, field }) => ({ type: "function_call_output", call_id: call.call_id, output: field.value })));
    });
    $("#transcript").append(card);
    answers[0].field.focus();
  }
}
