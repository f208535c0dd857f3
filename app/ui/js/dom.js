// Building the page's elements. Everything that came from a model, a tool, the store or
// the user is put in as text (text nodes, textContent), never parsed as HTML: this module
// is the only place that creates elements, and it has no way to set markup.

/** An element: `h("div", {className: "card", dataset: {status: "completed"}}, "text", child)`.
 * Properties named on* are refused: handlers are attached with addEventListener. */
export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null) continue;
    if (name.startsWith("on") || name === "innerHTML" || name === "outerHTML") {
      throw new Error(`h(): ${name} is not allowed`);
    }
    if (name === "dataset") Object.assign(element.dataset, value);
    else if (name in element) element[name] = value;
    else element.setAttribute(name, String(value));
  }
  append(element, ...children);
  return element;
}

/** Append children: strings and numbers become text nodes; null and false are skipped. */
export function append(parent, ...children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

export function clear(element) {
  element.replaceChildren();
  return element;
}

export const $ = (selector) => document.querySelector(selector);

/** JSON as indented text, for a `<pre>`. */
export function pretty(value) {
  return JSON.stringify(value, null, 2);
}

/** The spec's error object, shown as such (its param first). */
export function errorBox(target, error, status) {
  clear(target);
  target.hidden = false;
  const object = error && typeof error === "object" ? error : { message: String(error) };
  append(target, h("div", { className: "error-object" },
    h("div", {}, h("strong", {}, `Error${status ? " " + status : ""}: `), object.message ?? ""),
    h("div", {}, "code: ", h("code", { className: "code" }, String(object.code ?? "")),
      " · type: ", h("code", {}, String(object.type ?? "")),
      " · param: ", h("code", { className: "param" }, String(object.param ?? "null"))),
    h("pre", {}, pretty(object))));
}

export function hideError(target) {
  clear(target);
  target.hidden = true;
}

/** Offer `text` as a file download. */
export function download(name, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const link = h("a", { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
