// The official Node SDKs against the gateway, as a Node user calls it: only the base URL changes.
// Prints one JSON object of what each call returned; tests/test_node_clients.py checks it and the
// database. Usage: node clients.mjs <gateway url> <openai model> <anthropic model>
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

const [gatewayUrl, openaiModel, anthropicModel] = process.argv.slice(2);
const openai = new OpenAI({ baseURL: `${gatewayUrl}/v1`, apiKey: "gateway-key", maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: gatewayUrl, apiKey: "gateway-key", maxRetries: 0 });
const out = {};

const chat = await openai.chat.completions.create({
  model: openaiModel,
  messages: [{ role: "user", content: "Say hello from Node." }],
  temperature: 0.5,
});
out.chat = { id: chat.id, content: chat.choices[0].message.content, usage: chat.usage };

const chunks = [];
const stream = await openai.chat.completions.create({
  model: openaiModel,
  messages: [{ role: "user", content: "Stream hello from Node." }],
  stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of stream) chunks.push(chunk);
out.chatStream = {
  id: chunks[0].id,
  content: chunks.map((c) => c.choices[0]?.delta?.content ?? "").join(""),
  usage: chunks.at(-1).usage,
};

const withRaw = await openai.chat.completions
  .create({ model: openaiModel, messages: [{ role: "user", content: "And the trajectory?" }] })
  .withResponse();
out.trajectoryHeader = withRaw.response.headers.get("x-trajectory-id");

const response = await openai.responses.create({ model: openaiModel, input: "Hello through the Responses API." });
out.responses = { id: response.id, text: response.output_text, status: response.status };
const chained = await openai.responses.create({
  model: openaiModel,
  input: "And after that?",
  previous_response_id: response.id,
});
out.chained = { id: chained.id, previous: chained.previous_response_id, text: chained.output_text };

const responseEvents = [];
const responseStream = await openai.responses.create({ model: openaiModel, input: "Stream it.", stream: true });
for await (const event of responseStream) responseEvents.push(event.type);
out.responsesStream = { first: responseEvents[0], last: responseEvents.at(-1), count: responseEvents.length };

const models = [];
for await (const model of openai.models.list()) models.push(model.id);
out.models = models;

try {
  await openai.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "x" }] });
  out.unknownModel = { thrown: false };
} catch (error) {
  out.unknownModel = { thrown: true, name: error.constructor.name, status: error.status, message: error.message };
}

try {
  await openai.chat.completions.create({ model: openaiModel, messages: "not a list" });
  out.badRequest = { thrown: false };
} catch (error) {
  out.badRequest = { thrown: true, name: error.constructor.name, status: error.status, type: error.type };
}

const message = await anthropic.messages.create({
  model: anthropicModel,
  max_tokens: 64,
  messages: [{ role: "user", content: "Hello through the Messages API." }],
});
out.messages = { id: message.id, type: message.type, text: message.content[0].text, stop: message.stop_reason };

const messageStream = anthropic.messages.stream({
  model: anthropicModel,
  max_tokens: 64,
  messages: [{ role: "user", content: "Stream it through Messages." }],
});
const finalMessage = await messageStream.finalMessage();
out.messagesStream = { id: finalMessage.id, text: finalMessage.content[0].text, stop: finalMessage.stop_reason };

try {
  await anthropic.messages.create({ model: anthropicModel, messages: [{ role: "user", content: "no max_tokens" }] });
  out.anthropicBadRequest = { thrown: false };
} catch (error) {
  out.anthropicBadRequest = { thrown: true, name: error.constructor.name, status: error.status, type: error.error?.error?.type };
}

console.log(JSON.stringify(out));
