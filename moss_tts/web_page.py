"""The browser page served at `/` by `python -m moss_tts serve`: text in, speech out, playing
while it is generated (raw PCM over fetch, scheduled with Web Audio), then downloadable; and,
when a MOSS-TTS-Realtime model is served, a live mode: text is sent as it is typed or pasted
(WebSocket /v1/audio/live) and its speech plays as it arrives."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>moss-tts</title>
<style>
 body { font: 16px system-ui, sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; }
 textarea { width: 100%; height: 7rem; font: inherit; }
 .row { display: flex; gap: .75rem; align-items: center; margin: .75rem 0; flex-wrap: wrap; }
 #status, #live-status { color: #555; }
</style></head>
<body>
<h1>moss-tts</h1>
<textarea id="text">Hello! This speech is generated on a CPU, as you listen.</textarea>
<div class="row">
 <label>Voice <select id="voice"><option value="">(none)</option></select></label>
 <label>Reference <input id="reference" type="file" accept="audio/wav,audio/flac,.wav,.flac"></label>
 <label>Seed <input id="seed" type="number" style="width:6rem"></label>
 <label>API key <input id="key" type="password" placeholder="if the server needs one"
        style="width:10rem"></label>
</div>
<div class="row">
 <button id="speak">Speak</button>
 <audio id="player" controls></audio>
 <a id="download" download="speech.wav" hidden>Download</a>
 <span id="status"></span>
</div>
<section id="live" hidden>
<h2>Live</h2>
<p>Start, then type or paste: the text is spoken as it arrives. End turn lets the speech finish;
text typed after it starts the next turn.</p>
<textarea id="live-text" placeholder="Type here once live"></textarea>
<div class="row">
 <button id="live-start">Start live</button>
 <button id="live-end" disabled>End turn</button>
 <span id="live-status"></span>
</div>
</section>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
window.receivedBytes = 0;  // this request's audio bytes (the browser test reads it)

function authHeaders() {
  return $("key").value ? {Authorization: `Bearer ${$("key").value}`} : {};
}

async function loadVoices() {
  const r = await fetch("/v1/audio/voices", {headers: authHeaders()});
  if (!r.ok) return;
  $("voice").length = 1;  // keep "(none)"; this runs again when the API key changes
  for (const v of (await r.json()).voices) {
    const o = document.createElement("option");
    o.value = o.textContent = v.name;
    $("voice").appendChild(o);
  }
}

function toBase64(buffer) {
  let s = "";
  const bytes = new Uint8Array(buffer);
  for (let i = 0; i < bytes.length; i += 8192) s += String.fromCharCode(...bytes.subarray(i, i + 8192));
  return btoa(s);
}

function wavBlob(chunks, rate, channels) {
  const n = chunks.reduce((a, c) => a + c.length, 0);
  const view = new DataView(new ArrayBuffer(44 + n));
  const w = (o, s) => [...s].forEach((ch, i) => view.setUint8(o + i, ch.charCodeAt(0)));
  w(0, "RIFF"); view.setUint32(4, 36 + n, true); w(8, "WAVEfmt ");
  view.setUint32(16, 16, true); view.setUint16(20, 1, true); view.setUint16(22, channels, true);
  view.setUint32(24, rate, true); view.setUint32(28, rate * channels * 2, true);
  view.setUint16(32, channels * 2, true); view.setUint16(34, 16, true);
  w(36, "data"); view.setUint32(40, n, true);
  let o = 44;
  for (const c of chunks) { new Uint8Array(view.buffer, o, c.length).set(c); o += c.length; }
  return new Blob([view.buffer], {type: "audio/wav"});
}

function clearResult() {
  const old = $("player").src;
  $("player").removeAttribute("src"); $("player").load();
  $("download").hidden = true; $("download").removeAttribute("href");
  if (old.startsWith("blob:")) URL.revokeObjectURL(old);
}

function audioContext(rate) {
  // playback is best effort: some rates are outside Web Audio's range
  try { return new AudioContext({sampleRate: rate}); } catch (e) { console.warn(String(e)); }
  return null;
}

function play(ctx, at, pcm, rate, channels) {
  // s16le interleaved bytes → scheduled right after what is queued; the new end time
  const samples = new Int16Array(pcm.buffer, pcm.byteOffset, pcm.byteLength / 2);
  const frames = samples.length / channels;
  const buf = ctx.createBuffer(channels, frames, rate);
  for (let c = 0; c < channels; c++) {
    const ch = buf.getChannelData(c);
    for (let i = 0; i < frames; i++) ch[i] = samples[i * channels + c] / 32768;
  }
  const src = ctx.createBufferSource();
  src.buffer = buf; src.connect(ctx.destination);
  at = Math.max(at, ctx.currentTime); src.start(at);
  return at + buf.duration;
}

async function speak() {
  $("speak").disabled = true; $("status").textContent = "generating…";
  clearResult();  // a failure must not leave the previous result on screen
  window.receivedBytes = 0;
  const body = {model: "tts-1", input: $("text").value, stream_format: "audio",
                response_format: "pcm", pcm_layout: "native"};
  if ($("voice").value) body.voice = $("voice").value;
  if ($("seed").value) body.seed = Number($("seed").value);
  const file = $("reference").files[0];
  if (file) body.reference_audio = toBase64(await file.arrayBuffer());
  try {
    const r = await fetch("/v1/audio/speech", {method: "POST", body: JSON.stringify(body),
      headers: {"Content-Type": "application/json", ...authHeaders()}});
    if (!r.ok) {
      const text = await r.text();
      let message = `HTTP ${r.status}`;
      try { message = JSON.parse(text).error.message; } catch (e) { /* not JSON */ }
      $("status").textContent = `error: ${message}`;
      return;
    }
    const rate = Number(r.headers.get("X-Audio-Sample-Rate")), channels = Number(r.headers.get("X-Audio-Channels"));
    const ctx = audioContext(rate);
    let at = ctx ? ctx.currentTime + 0.1 : 0, carry = new Uint8Array(0);
    const chunks = [], reader = r.body.getReader();
    for (;;) {
      const {done, value} = await reader.read();  // throws if the server cuts a failed stream
      if (done) break;
      window.receivedBytes += value.length;
      const bytes = new Uint8Array(carry.length + value.length);
      bytes.set(carry); bytes.set(value, carry.length);
      const frameBytes = 2 * channels, usable = bytes.length - (bytes.length % frameBytes);
      carry = bytes.slice(usable);
      if (!usable) continue;
      const pcm = bytes.slice(0, usable);
      chunks.push(pcm);
      if (ctx) at = play(ctx, at, pcm, rate, channels);
    }
    const url = URL.createObjectURL(wavBlob(chunks, rate, channels));
    $("player").src = url; $("download").href = url; $("download").hidden = false;
    $("status").textContent = `${(window.receivedBytes / (2 * channels * rate)).toFixed(2)} s`;
  } catch (e) {
    clearResult();
    $("status").textContent = `error: ${e}`;
  } finally {
    $("speak").disabled = false;
  }
}

// live mode: one WebSocket per Start; `spoken` is the text sent so far (only text added at the
// end can be sent: what was spoken cannot be taken back)
let live = null;
window.liveBytes = 0;     // audio bytes of this live connection (the browser test reads it)
window.liveDone = [];     // its turn_done events

async function findLiveModel() {
  const r = await fetch("/v1/models", {headers: authHeaders()});
  const model = r.ok ? (await r.json()).data.find((m) => m.live) : undefined;
  $("live").hidden = !model;
  window.liveModel = model ? model.id : null;
}

function liveState(running) {
  $("live-start").textContent = running ? "Stop live" : "Start live";
  $("live-end").disabled = !running;
}

function startLive() {
  if (live) { live.ws.close(); return; }
  const key = $("key").value ? `?api_key=${encodeURIComponent($("key").value)}` : "";
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}` +
                           `/v1/audio/live${key}`);
  ws.binaryType = "arraybuffer";
  live = {ws, ctx: null, at: 0, rate: 0, channels: 1, started: false, ended: false,
          finished: false, sent: false, spoken: ""};   // text already in the box is spoken first
  window.liveBytes = 0; window.liveDone = [];
  liveState(true); $("live-status").textContent = "connecting…";
  ws.onopen = () => {
    const config = {model: window.liveModel};
    if ($("voice").value) config.voice = $("voice").value;
    if ($("seed").value) config.seed = Number($("seed").value);
    ws.send(JSON.stringify(config));
  };
  ws.onmessage = (e) => liveMessage(ws, e.data);
  ws.onclose = () => {
    const started = live && live.ws === ws && live.started;
    if (live && live.ws === ws) live = null;
    liveState(false);
    if (!$("live-status").textContent.startsWith("error"))
      $("live-status").textContent = started ? "closed" : "error: refused (is the API key right?)";
  };
}

function liveMessage(ws, data) {
  if (!live || live.ws !== ws) return;
  if (typeof data !== "string") {
    window.liveBytes += data.byteLength;
    if (live.ctx) live.at = play(live.ctx, live.at, new Uint8Array(data), live.rate, live.channels);
    return;
  }
  const event = JSON.parse(data);
  if (event.type === "started") {
    Object.assign(live, {started: true, rate: event.sample_rate, channels: event.channels,
                         ctx: audioContext(event.sample_rate)});
    live.at = live.ctx ? live.ctx.currentTime + 0.1 : 0;
    $("live-status").textContent = "live: type or paste";
    sendLiveText();
  } else if (event.type === "turn_done") {
    window.liveDone.push(event); live.finished = true;
    $("live-status").textContent = `turn done: ${event.seconds.toFixed(2)} s`;
    sendLiveText();   // text typed while the turn finished opens the next one
  } else if (event.type === "error") {
    $("live-status").textContent = `error: ${event.message}`;
  }
}

function sendLiveText() {
  if (!live || !live.started) return;
  const text = $("live-text").value;
  if (!text.startsWith(live.spoken)) {   // an edit before the end: keep speaking from here on
    live.spoken = text;
    $("live-status").textContent = "only text added at the end is spoken";
    return;
  }
  const delta = text.slice(live.spoken.length);
  if (!delta) return;
  if (live.ended) {   // a turn sent before turn_done would cut the speech short (barge-in)
    if (!live.finished) return;
    live.ws.send(JSON.stringify({type: "turn"}));
    live.ended = live.finished = false;
  }
  live.ws.send(JSON.stringify({type: "text", text: delta}));
  live.spoken = text; live.sent = true;
}

function endLiveTurn() {
  if (!live || !live.started || live.ended || !live.sent) return;
  live.ws.send(JSON.stringify({type: "end"}));
  live.ended = true; live.sent = false;
  $("live-status").textContent = "finishing the turn…";
}

$("speak").addEventListener("click", speak);
$("key").addEventListener("change", () => { loadVoices(); findLiveModel(); });
$("live-start").addEventListener("click", startLive);
$("live-end").addEventListener("click", endLiveTurn);
$("live-text").addEventListener("input", sendLiveText);
loadVoices();
findLiveModel();
</script>
</body></html>
"""
