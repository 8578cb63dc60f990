// openai_client.mjs — the official `openai` npm package against a running `qwenrt serve`
// (tests/cli_server_openai.sh): model list, chat and completions, streaming and not, usage
// with cached tokens, stop, seeds, and the package's own error classes for a 404 and a 400.
// Usage: node openai_client.mjs BASE_URL MODEL_ID API_KEY
import OpenAI from "openai";

const [base, modelId, key] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + "/v1", apiKey: key, maxRetries: 0, timeout: 60000 });
const fail = (msg) => { console.error("FAIL: " + msg); process.exit(1); };
const eq = (a, b, what) => { if (a !== b) fail(`${what}: ${JSON.stringify(a)} !== ${JSON.stringify(b)}`); };

const models = await client.models.list();
eq(models.data.length, 1, "one model");
eq(models.data[0].id, modelId, "model id");

const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello!" }];
const req = { model: modelId, messages, max_tokens: 12, temperature: 0 };
const whole = await client.chat.completions.create(req);
eq(whole.object, "chat.completion", "object");
eq(whole.choices.length, 1, "one choice");
eq(whole.choices[0].message.role, "assistant", "role");
const text = whole.choices[0].message.content;
if (typeof text !== "string" || !text.length) fail("no text");
if (!["stop", "length"].includes(whole.choices[0].finish_reason)) fail("finish_reason");
eq(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens, "total");

// streaming gives the same greedy text, chunk by chunk, and a usage chunk at the end
const stream = await client.chat.completions.create({ ...req, stream: true,
                                                      stream_options: { include_usage: true } });
let streamed = "", chunks = 0, usage = null, finish = null;
for await (const chunk of stream) {
  eq(chunk.object, "chat.completion.chunk", "chunk object");
  if (chunk.usage) usage = chunk.usage;
  if (!chunk.choices.length) continue;
  chunks++;
  streamed += chunk.choices[0].delta.content || "";
  if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
}
eq(streamed, text, "streamed text");
if (chunks < 2) fail("the stream came in one piece");
eq(finish, whole.choices[0].finish_reason, "stream finish_reason");
if (!usage) fail("no usage chunk");
eq(usage.completion_tokens, whole.usage.completion_tokens, "stream usage");
// the same prompt again: all of it comes from the prompt cache
eq(usage.prompt_tokens_details.cached_tokens, usage.prompt_tokens, "cached tokens of a repeat");

// second turn: reuses the first turn from the cache
const turn2 = await client.chat.completions.create({ ...req, messages: [...messages,
  { role: "assistant", content: text }, { role: "user", content: "And then?" }] });
if (!(turn2.usage.prompt_tokens_details.cached_tokens > 0)) fail("turn 2 used no cache");

// completions, sampled with a seed: same seed, same text
const c = { model: modelId, prompt: "Once upon a time", max_tokens: 10, temperature: 1.0, seed: 7 };
const c1 = await client.completions.create(c), c2 = await client.completions.create(c);
eq(c1.object, "text_completion", "completion object");
eq(c1.choices[0].text, c2.choices[0].text, "same seed");
let cs = "";
for await (const chunk of await client.completions.create({ ...c, stream: true }))
  cs += chunk.choices.length ? chunk.choices[0].text : "";
eq(cs, c1.choices[0].text, "streamed completion");

// errors arrive as the package's error classes with OpenAI's fields
try {
  await client.chat.completions.create({ ...req, model: "no-such-model" });
  fail("unknown model accepted");
} catch (e) {
  if (!(e instanceof OpenAI.NotFoundError)) fail("unknown model: " + e);
  eq(e.code, "model_not_found", "404 code");
}
try {
  await client.chat.completions.create({ ...req, temperature: 9 });
  fail("temperature 9 accepted");
} catch (e) {
  if (!(e instanceof OpenAI.BadRequestError)) fail("bad temperature: " + e);
  eq(e.param, "temperature", "400 param");
}
const noKey = new OpenAI({ baseURL: base + "/v1", apiKey: "wrong", maxRetries: 0 });
try {
  await noKey.models.list();
  fail("wrong key accepted");
} catch (e) {
  if (!(e instanceof OpenAI.AuthenticationError)) fail("wrong key: " + e);
}
console.log("openai_client: ok (" + JSON.stringify(text) + ")");
