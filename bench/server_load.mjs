// server_load.mjs — load benchmark for `qwenrt serve` (not a test): N concurrent clients, each
// sending streaming chat requests back to back for a bounded time; counts requests started,
// completed (ended with [DONE]) and failed, streamed tokens (one SSE content chunk = one
// token), time to first token, and prints aggregate tokens/s. Plain fetch, no npm packages.
// Usage: node server_load.mjs BASE_URL CLIENTS SECONDS MAX_TOKENS
const [base, nClients, seconds, maxTokens] = [process.argv[2], +process.argv[3],
                                               +process.argv[4], +process.argv[5]];
const stats = { started: 0, done: 0, failed: 0, tokens: 0, ttft: [], errors: {} };
const deadline = Date.now() + seconds * 1000;

async function one(client, k) {
  const t0 = performance.now();
  stats.started++;
  const body = { messages: [{ role: "user", content: `client ${client} request ${k}: say something` }],
                 max_tokens: maxTokens, temperature: 0.8, seed: client * 1000 + k, stream: true };
  const r = await fetch(base + "/v1/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  if (!r.ok) throw new Error("HTTP " + r.status + " " + (await r.text()).slice(0, 200));
  const reader = r.body.getReader(), dec = new TextDecoder();
  let buf = "", first = true, done = false;
  while (!done) {
    const { value, done: end } = await reader.read();
    if (end) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, cut).replace(/^data: /, "");
      buf = buf.slice(cut + 2);
      if (ev === "[DONE]") { done = true; break; }
      const j = JSON.parse(ev);
      if (j.error) throw new Error(j.error.message);
      if (j.choices.length && j.choices[0].delta.content !== undefined && !j.choices[0].delta.role) {
        if (first) { stats.ttft.push(performance.now() - t0); first = false; }
        stats.tokens++;
      }
    }
  }
  if (!done) throw new Error("stream ended without [DONE]");
  stats.done++;
}

async function client(c) {
  for (let k = 0; Date.now() < deadline; k++) {
    try { await one(c, k); } catch (e) {
      stats.failed++;
      const key = String(e.message).slice(0, 80);
      stats.errors[key] = (stats.errors[key] || 0) + 1;
    }
  }
}

const t0 = performance.now();
await Promise.all(Array.from({ length: nClients }, (_, c) => client(c)));
const wall = (performance.now() - t0) / 1000;
stats.ttft.sort((a, b) => a - b);
const pct = (p) => stats.ttft.length ? stats.ttft[Math.min(stats.ttft.length - 1,
                                                           Math.floor(p * stats.ttft.length))] : 0;
console.log(JSON.stringify({ clients: nClients, seconds: +wall.toFixed(2), started: stats.started,
  completed: stats.done, failed: stats.failed, tokens: stats.tokens,
  tokens_per_s: +(stats.tokens / wall).toFixed(1), ttft_ms_p50: +pct(0.5).toFixed(1),
  ttft_ms_p95: +pct(0.95).toFixed(1), errors: stats.errors }));
