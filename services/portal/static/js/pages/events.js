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

function sendExample(type, endpoints) {
  const usable = endpoints.filter((e) => e.status === "enabled");
  if (!usable.length) return h("p", { class: "muted" }, "Create an endpoint to send an example to.");
  const target = select(usable.map((e) => [e.id, e.name]), usable[0].id);
  return form(
    `Send an example of ${type}`,
    field("Endpoint", target),
    "Send example",
    async () => {
      const body = await api("POST", `/v1/webhook-endpoints/${enc(target.value)}/test`, { eventType: type });
      toast(`Example of ${type} sent`);
      go(`/deliveries/${body.webhookDelivery.id}`);
    },
  );
}


