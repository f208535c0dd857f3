// The page as a client of the public API: the key, JSON requests, SSE streams read from
// fetch (EventSource cannot POST nor send a key), and the WebSocket transport.

const KEY = "ors.key";
const TERMINAL = new Set(["response.completed", "response.incomplete", "response.failed", "response.cancelled"]);

export class ApiError extends Error {
  /** A refusal: the HTTP status (or a WebSocket envelope's) and the spec's error object. */
  constructor(status, error) {
    super(error?.message ?? `HTTP ${status}`);
    this.status = status;
    this.error = error ?? { message: `HTTP ${status}` };
  }
}

export const keyStore = {
  get: () => sessionStorage.getItem(KEY) ?? "",
  set: (key) => (key ? sessionStorage.setItem(KEY, key) : sessionStorage.removeItem(KEY)),
};

let askForKey = async () => false;
/** `ask()` is called on a 401; it resolves true once the user gave a key. */
export function onKeyNeeded(ask) {
  askForKey = ask;
}

function headers(json) {
  const result = {};
  const key = keyStore.get();
  if (key) result.Authorization = `Bearer ${key}`;
  if (json) result["Content-Type"] = "application/json";
  return result;
}

async function refusal(reply) {
  let body = null;
  try {
    body = await reply.json();
  } catch {
    body = null;
  }
  return new ApiError(reply.status, body?.error ?? { message: `HTTP ${reply.status}` });
}

/** A request to this server; a 401 asks for the key once and tries again. */
export async function request(path, { method = "GET", body, signal } = {}, retried = false) {
  const reply = await fetch(path, {
    method, signal, headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (reply.status === 401 && !retried && (await askForKey())) return request(path, { method, body, signal }, true);
  if (!reply.ok) throw await refusal(reply);
  return reply;
}

export async function json(path, options) {
  return (await request(path, options)).json();
}

/** The events of an SSE reply, parsed as they arrive: `{event, data}` per event. */
export async function* sse(reply) {
  const reader = reply.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { event, data: data.join("\n") };
    }
  }
}

/** Stream a response over HTTP: each event (parsed) to `onEvent`; ends at `[DONE]`. */
export async function streamHttp(body, onEvent, signal) {
  const reply = await request("/v1/responses", { method: "POST", body: { ...body, stream: true }, signal });
  for await (const { data } of sse(reply)) {
    if (data === "[DONE]") return;
    onEvent(JSON.parse(data));
  }
}

/** Replay a stored response's events (`GET /v1/responses/{id}?stream=true`). */
export async function replay(id, onEvent, signal) {
  const reply = await request(`/v1/responses/${encodeURIComponent(id)}?stream=true`, { signal });
  for await (const { data } of sse(reply)) {
    if (data === "[DONE]") return;
    onEvent(JSON.parse(data));
  }
}

let socket = null;

function openSocket() {
  if (socket && socket.readyState <= WebSocket.OPEN) return socket;
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/responses`;
  const key = keyStore.get();
  // A browser cannot set the Authorization header of a WebSocket: the key goes as a
  // subprotocol beside "responses", the one the server selects.
  socket = new WebSocket(url, key ? ["responses", `openai-insecure-api-key.${key}`] : ["responses"]);
  return socket;
}

/** Stream a response over the WebSocket transport (one socket kept open for the page):
 * each event to `onEvent`, until the turn's terminal event or error envelope. */
export function streamSocket(body, onEvent, signal) {
  return new Promise((resolve, reject) => {
    const ws = openSocket();
    const done = (error) => {
      ws.removeEventListener("message", onMessage);
      ws.removeEventListener("close", onClose);
      signal?.removeEventListener("abort", onAbort);
      error ? reject(error) : resolve();
    };
    const onMessage = (message) => {
      const event = JSON.parse(message.data);
      if (event.type === "error" && event.error && !event.sequence_number) {
        done(new ApiError(event.status ?? 400, event.error));
        return;
      }
      onEvent(event);
      if (TERMINAL.has(event.type)) done();
    };
    const onClose = (close) => done(new ApiError(close.code, { message: `WebSocket closed (${close.code})` }));
    const onAbort = () => ws.close();
    ws.addEventListener("message", onMessage);
    ws.addEventListener("close", onClose);
    signal?.addEventListener("abort", onAbort);
    const send = () => ws.send(JSON.stringify({ type: "response.create", ...body }));
    if (ws.readyState === WebSocket.OPEN) send();
    else ws.addEventListener("open", send, { once: true });
  });
}

export function closeSocket() {
  socket?.close();
  socket = null;
}
