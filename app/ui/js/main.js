// The playground's wiring: tabs, the key, the models, and the three parts.

import { closeSocket, json, keyStore, onKeyNeeded } from "./api.js";
import { Chat } from "./chat.js";
import { Checks } from "./checks.js";
import { $, h } from "./dom.js";
import { Stored } from "./stored.js";

function askForKey() {
  const dialog = $("#key-dialog");
  $("#key-input").value = keyStore.get();
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      const saved = dialog.returnValue === "save";
      if (saved) {
        keyStore.set($("#key-input").value.trim());
        closeSocket(); // the next WebSocket offers the new key
      }
      resolve(saved);
    }, { once: true });
  });
}

async function loadModels() {
  const models = await json("/v1/models");
  for (const target of [$("#model"), $("#check-model")]) {
    target.replaceChildren(...models.data.map((model) => h("option", { value: model.id }, model.id)));
  }
}

function showTab(name) {
  for (const button of document.querySelectorAll("#tabs button")) button.classList.toggle("active", button.dataset.tab === name);
  for (const tab of document.querySelectorAll(".tab")) tab.hidden = tab.id !== `tab-${name}`;
}

async function start() {
  onKeyNeeded(askForKey);
  $("#key-button").addEventListener("click", () => askForKey());
  $("#transport").addEventListener("change", () => closeSocket());
  const chat = new Chat();
  const stored = new Stored((id) => { chat.continueFrom(id); showTab("chat"); });
  new Checks();
  for (const button of document.querySelectorAll("#tabs button")) {
    button.addEventListener("click", () => {
      showTab(button.dataset.tab);
      if (button.dataset.tab === "stored") stored.load(true);
    });
  }
  await loadModels();
  document.body.dataset.ready = "true";
}

start();
