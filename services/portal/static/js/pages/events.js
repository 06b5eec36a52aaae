// The event catalog: every type, its JSON Schema and an example; send an example of any
// type to an endpoint.

import { api, enc } from "../api.js";
import { go, session } from "../session.js";
import { code, field, form, h, pre, select, toast } from "../ui.js";
import { allEndpoints, eventTypes } from "./shared.js";

export async function render(root) {
  const [types, endpoints] = await Promise.all([eventTypes(), allEndpoints()]);
  root.append(
    h("h1", {}, "Event catalog"),
    h("p", { class: "muted" }, "Also served to programs as ", code("GET /v1/event-types"), "."),
  );
  const list = h("div", { class: "catalog" });
  for (const type of types) {
    const item = h(
      "article",
      { class: "event-type", "aria-labelledby": `type-${type.type}` },
      h("h2", { id: `type-${type.type}` }, code(type.type)),
      type.description ? h("p", {}, type.description) : null,
      type.schema ? h("details", {}, h("summary", {}, "JSON Schema"), pre(type.schema)) : null,
      type.example ? h("details", {}, h("summary", {}, "Example payload"), pre(type.example)) : null,
    );
    // An example can be sent where the catalog has one (GET /v1/event-types).
    if (session.can("developer") && type.example) item.append(sendExample(type.type, endpoints));
    list.append(item);
  }
  root.append(list);
}

// No endpoint is chosen for you (the first in the list may be production's), and the
// portal asks before sending: the example is signed like a real event, though marked a
// test (`livemode: false`, `x-service-test: 1`, ids no real object has).
function sendExample(type, endpoints) {
  const usable = endpoints.filter((e) => e.status === "enabled");
  if (!usable.length) return h("p", { class: "muted" }, "Create an endpoint to send an example to.");
  const target = select([["", "Choose an endpoint…"], ...usable.map((e) => [e.id, e.name])], "");
  const question = h("p", { class: "confirm-question", role: "status" });
  let confirmed = "";
  target.addEventListener("change", () => {
    confirmed = "";
    question.replaceChildren();
  });
  return form(
    `Send an example of ${type}`,
    [field("Endpoint", target), question],
    "Send example",
    async (el) => {
      const chosen = usable.find((e) => e.id === target.value);
      if (!chosen) throw new Error("Choose the endpoint to send the example to.");
      const submit = el.querySelector('button[type="submit"]');
      if (confirmed !== chosen.id) {
        confirmed = chosen.id;
        question.replaceChildren(
          `Send a test example of ${type} to ${chosen.name} (${chosen.url})? It is signed like a real ` +
            "event and marked livemode: false, with the header x-service-test: 1.",
        );
        submit.textContent = "Yes, send the example";
        return;
      }
      const body = await api("POST", `/v1/webhook-endpoints/${enc(chosen.id)}/test`, { eventType: type });
      toast(`Example of ${type} sent`);
      go(`/deliveries/${body.webhookDelivery.id}`);
    },
  );
}
