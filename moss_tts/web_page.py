"""The browser page served at `/` by `python -m moss_tts serve`: text in, speech out, playing
while it is generated (raw PCM over fetch, scheduled with Web Audio), then downloadable."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>moss-tts</title>
<style>
 body { font: 16px system-ui, sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; }
 textarea { width: 100%; height: 7rem; font: inherit; }
 .row { display: flex; gap: .75rem; align-items: center; margin: .75rem 0; flex-wrap: wrap; }
 #status { color: #555; }
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
    let ctx = null;  // live playback is best effort: some rates are outside Web Audio's range
    try { ctx = new AudioContext({sampleRate: rate}); } catch (e) { console.warn(String(e)); }
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
      if (!ctx) continue;
      const samples = new Int16Array(pcm.buffer), frames = samples.length / channels;
      const buf = ctx.createBuffer(channels, frames, rate);
      for (let c = 0; c < channels; c++) {
        const ch = buf.getChannelData(c);
        for (let i = 0; i < frames; i++) ch[i] = samples[i * channels + c] / 32768;
      }
      const src = ctx.createBufferSource();
      src.buffer = buf; src.connect(ctx.destination);
      at = Math.max(at, ctx.currentTime); src.start(at); at += buf.duration;
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

$("speak").addEventListener("click", speak);
$("key").addEventListener("change", loadVoices);
loadVoices();
</script>
</body></html>
"""
