'use strict';
// The Connect transport of the unary calls: binary protobuf
// (`application/proto`) POSTed over kept-alive HTTP/1.1 connections to the
// server's gRPC port, which serves Connect beside gRPC (docs/api.md,
// "Connect and gRPC-Web on the gRPC port"). The server turns each request
// into the gRPC call it stands for, so auth, validation, deadlines and
// errors are the same.
//
// Why: one @grpc/grpc-js unary call costs this process several hundred
// microseconds of its own CPU (its call stack of filters, resolving and
// retrying calls, http2 header objects, and the garbage they leave); one
// request written to a socket and one answer read from it cost a few tens
// (clients/node/README.md, "What a call costs").
//
// The messages are encoded and decoded by the same functions grpc-js uses
// (proto-loader's requestSerialize / responseDeserialize, protobufjs with
// longs and enums as strings, defaults, oneofs), so a call resolves to the
// same object on either transport. A failed call rejects with an Error that
// has gRPC's `code` (a grpc.status number) and `details`, so the client's
// retry loop and errors.fromGrpcError treat both transports alike.
//
// A connection serves one call at a time: a call takes an idle one from the
// pool or opens one, and gives it back once the whole answer is in. The
// request leaves in one write with TCP_NODELAY, so no call waits on a
// delayed ACK. `Connect-Timeout-Ms` carries the deadline to the server, and
// a local timer ends the call at the same deadline. A call cut by its
// deadline or cancelled destroys its connection, which is how the server
// learns the caller is gone (a waiting Acquire leaves the queue). A reused
// connection that the server had closed while idle is replaced and the
// request sent once more, only when nothing of an answer came back.
const net = require('net');
const { status } = require('@grpc/grpc-js');

const SERVICE = 'tumbler.v1.LockService';
// Idle connections kept per client; more are closed when given back.
const MAX_IDLE = 64;
// Each connection's read buffer: an answer longer than this is read in pieces.
const READ_BUFFER = 16384;

// Connect's error codes (the JSON body's "code") -> gRPC status numbers.
const CODES = {};
for (const [name, number] of Object.entries(status)) CODES[name.toLowerCase()] = number;
CODES.canceled = status.CANCELLED;
// What an HTTP status means when the body names no code (Connect's table, read backwards).
const HTTP_CODES = {
  400: status.INTERNAL, 401: status.UNAUTHENTICATED, 403: status.PERMISSION_DENIED, 404: status.UNIMPLEMENTED,
  429: status.UNAVAILABLE, 502: status.UNAVAILABLE, 503: status.UNAVAILABLE, 504: status.UNAVAILABLE,
};

const CRLF2 = Buffer.from('\r\n\r\n');

function rpcError(code, details) {
  const name = Object.keys(status).find((k) => status[k] === code) || 'UNKNOWN';
  return Object.assign(new Error(`${code} ${name}: ${details}`), { code, details, metadata: null });
}

// "host:port" or "[v6]:port" -> { host, port }; null for targets only grpc-js
// resolves (dns:///…, unix:…, ipv4:…, several addresses) or without a port.
function splitTarget(target) {
  if (typeof target !== 'string' || target.includes('/') || /^[a-z0-9+.-]+:[^0-9[]/i.test(target)) return null;
  const i = target.lastIndexOf(':');
  if (i <= 0) return null;
  const port = target.slice(i + 1);
  let host = target.slice(0, i);
  if (!/^\d{1,5}$/.test(port) || Number(port) > 65535) return null;
  if (host.startsWith('[') && host.endsWith(']')) host = host.slice(1, -1);
  else if (host.includes(':') || host.includes(',')) return null;
  return host ? { host, port: Number(port) } : null;
}

// The gRPC error of a non-200 answer: its JSON's code and message, else the HTTP status's code.
function errorFromAnswer(httpStatus, body) {
  let code;
  let message = '';
  try {
    const err = JSON.parse(body.toString('utf8'));
    code = CODES[err.code];
    message = typeof err.message === 'string' ? err.message : '';
  } catch {
    message = body.toString('utf8', 0, Math.min(body.length, 200));
  }
  if (code === undefined) {
    code = HTTP_CODES[httpStatus] ?? status.UNKNOWN;
    message = message || `HTTP ${httpStatus}`;
  }
  return rpcError(code, message);
}

// Parses the answer at the start of `buf`: { status, body, keep, used } once
// it is whole, null while more is to come, with eof: the connection ended
// (an answer with neither a length nor chunks ends there). Throws on a
// malformed answer.
function parseAnswer(buf, eof) {
  const end = buf.indexOf(CRLF2);
  if (end < 0) return null;
  const head = buf.latin1Slice(0, end);
  const sp = head.indexOf(' ');
  const httpStatus = Number(head.slice(sp + 1, sp + 4));
  if (sp < 0 || !(httpStatus >= 100 && httpStatus < 600) || !head.startsWith('HTTP/1.')) {
    throw new Error(`not an HTTP/1.1 answer: ${JSON.stringify(head.slice(0, 40))}`);
  }
  let length = -1;
  let chunked = false;
  let keep = head.startsWith('HTTP/1.1');
  for (let at = head.indexOf('\r\n'); at >= 0;) {
    const next = head.indexOf('\r\n', at + 2);
    const line = head.slice(at + 2, next < 0 ? head.length : next);
    at = next;
    const colon = line.indexOf(':');
    if (colon < 0) continue;
    const name = line.slice(0, colon).trim().toLowerCase();
    if (name === 'content-length') length = Number(line.slice(colon + 1).trim());
    else if (name === 'transfer-encoding') chunked = line.toLowerCase().includes('chunked');
    else if (name === 'connection') {
      const v = line.slice(colon + 1).trim().toLowerCase();
      keep = keep ? v !== 'close' : v === 'keep-alive';
    }
  }
  const start = end + 4;
  if (chunked) {
    const parts = [];
    for (let at = start; ;) {
      const eol = buf.indexOf('\r\n', at);
      if (eol < 0) return null;
      const size = parseInt(buf.latin1Slice(at, eol).split(';')[0], 16);
      if (Number.isNaN(size)) throw new Error('a malformed chunk size');
      if (size === 0) { // no trailers are sent: the last empty line
        if (buf.length < eol + 4) return null;
        return { status: httpStatus, body: Buffer.concat(parts), keep, used: eol + 4 };
      }
      if (buf.length < eol + 2 + size + 2) return null;
      parts.push(buf.subarray(eol + 2, eol + 2 + size));
      at = eol + 2 + size + 2;
    }
  }
  if (length >= 0) {
    if (buf.length < start + length) return null;
    return { status: httpStatus, body: buf.subarray(start, start + length), keep, used: start + length };
  }
  if (httpStatus === 204 || httpStatus === 304 || httpStatus < 200) {
    return { status: httpStatus, body: buf.subarray(start, start), keep, used: start };
  }
  return eof ? { status: httpStatus, body: buf.subarray(start), keep: false, used: buf.length } : null;
}

// One HTTP/1.1 connection: at most one call on it at a time.
class Conn {
  constructor(transport) {
    this.transport = transport;
    // Reads land in one buffer of the connection's (no stream, no Buffer per read): an answer that
    // arrives whole is parsed and decoded in place; only one split across reads is copied.
    this.socket = net.connect({
      host: transport.host, port: transport.port, noDelay: true,
      onread: { buffer: Buffer.allocUnsafe(READ_BUFFER), callback: (n, buf) => { this.onData(buf.subarray(0, n)); } },
    });
    this.socket.setNoDelay(true);
    this.buf = null; // what came of the current answer so far (a copy), when it came in more than one read
    this.call = null; // the call waiting for an answer: { done(err, answer), reused }
    this.used = false; // an answer was read on it before
    this.dead = false;
    this.socket.on('end', () => this.onEnd(null));
    this.socket.on('error', (err) => this.onEnd(err));
    this.socket.on('close', () => this.onEnd(null));
  }

  send(bytes, call) {
    this.call = call;
    this.buf = null;
    this.socket.ref();
    this.socket.write(bytes);
  }

  // `chunk` is a view of the read buffer, valid until this returns.
  onData(chunk) {
    if (this.call === null) { this.destroy(); return; } // nothing was asked: junk, or the server ending it
    const data = this.buf === null ? chunk : Buffer.concat([this.buf, chunk]);
    let answer;
    try {
      answer = parseAnswer(data, false);
    } catch (err) {
      this.fail(rpcError(status.UNAVAILABLE, `${this.transport.authority}: ${err.message}`));
      return;
    }
    if (answer !== null) this.finish(answer, data.length);
    else this.buf = data === chunk ? Buffer.from(chunk) : data;
  }

  // The answer is decoded (call.done) before the read buffer is read into again.
  finish(answer, length) {
    const { call } = this;
    this.call = null;
    this.used = true;
    const extra = answer.used < length;
    this.buf = null;
    if (answer.keep && !extra && !this.dead) this.transport.giveBack(this);
    else this.destroy();
    call.done(null, answer);
  }

  onEnd(err) {
    if (this.dead && this.call === null) return;
    this.dead = true;
    const { call } = this;
    if (call === null) { this.socket.destroy(); return; }
    if (this.buf !== null) { // an answer read to the end of the connection?
      let answer = null;
      try { answer = parseAnswer(this.buf, true); } catch { answer = null; }
      if (answer !== null) { this.finish(answer, this.buf.length); return; }
    }
    const nothing = this.buf === null;
    this.call = null;
    this.buf = null;
    this.socket.destroy();
    if (this.used && nothing && !call.reused) { call.resend(); return; }
    const why = err ? err.message : 'the server closed the connection';
    call.done(rpcError(status.UNAVAILABLE, `${this.transport.authority}: ${why}`));
  }

  fail(err) {
    const { call } = this;
    this.call = null;
    this.destroy();
    if (call) call.done(err);
  }

  destroy() {
    this.dead = true;
    this.call = null;
    this.socket.destroy();
  }
}

// The unary methods of LockService over Connect (binary proto), on kept-alive HTTP/1.1 connections.
class ConnectTransport {
  // serviceDef: the service's method definitions (LockService.service, from proto-loader);
  // headers: extra request headers ({ authorization: 'Bearer …' }).
  constructor(host, port, serviceDef, headers = {}) {
    this.host = host;
    this.port = port;
    this.authority = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
    const extra = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('');
    this.methods = {};
    for (const [name, def] of Object.entries(serviceDef)) {
      if (def.requestStream || def.responseStream) continue;
      this.methods[name] = {
        serialize: def.requestSerialize,
        deserialize: def.responseDeserialize,
        prefix: `POST /${SERVICE}/${name} HTTP/1.1\r\nHost: ${this.authority}\r\n`
          + `Content-Type: application/proto\r\nConnect-Protocol-Version: 1\r\n${extra}Content-Length: `,
      };
    }
    this.idle = [];
    this.closed = false;
  }

  has(method) { return Object.prototype.hasOwnProperty.call(this.methods, method); }

  take() {
    while (this.idle.length) {
      const conn = this.idle.pop();
      if (!conn.dead) return conn;
    }
    return new Conn(this);
  }

  giveBack(conn) {
    if (this.closed || this.idle.length >= MAX_IDLE) { conn.destroy(); return; }
    conn.socket.unref(); // an idle connection does not keep the process alive (nor does grpc-js's)
    this.idle.push(conn);
  }

  // Sends one request; callback(err, response) once, unless cancelled. Returns { cancel() }.
  unary(method, request, timeoutMs, callback) {
    const m = this.methods[method];
    if (this.closed) {
      process.nextTick(callback, rpcError(status.UNAVAILABLE, 'the client was closed'));
      return { cancel() {} };
    }
    let body;
    try {
      body = m.serialize(request);
    } catch (err) {
      process.nextTick(callback, rpcError(status.INTERNAL, `request serialization failure: ${err.message}`));
      return { cancel() {} };
    }
    const wait = Math.max(1, Math.ceil(timeoutMs));
    const head = `${m.prefix}${body.length}\r\nConnect-Timeout-Ms: ${wait}\r\n\r\n`;
    const bytes = Buffer.allocUnsafe(head.length + body.length);
    bytes.latin1Write(head, 0);
    bytes.set(body, head.length);
    let conn = null;
    let over = false;
    const call = {
      reused: false,
      done: (err, answer) => {
        if (over) return;
        over = true;
        clearTimeout(timer);
        if (err) { callback(err); return; }
        if (answer.status !== 200) { callback(errorFromAnswer(answer.status, answer.body)); return; }
        let resp;
        try {
          resp = m.deserialize(answer.body);
        } catch (e) {
          callback(rpcError(status.INTERNAL, `response message parsing error: ${e.message}`));
          return;
        }
        callback(null, resp);
      },
      // A reused connection the server had closed: once more on a fresh one.
      resend: () => {
        if (over) return;
        call.reused = true;
        conn = new Conn(this);
        conn.send(bytes, call);
      },
    };
    const timer = setTimeout(() => {
      conn.destroy(); // the server sees the connection go and drops the call
      call.done(rpcError(status.DEADLINE_EXCEEDED, `Deadline exceeded after ${wait} ms`));
    }, wait);
    conn = this.take();
    conn.send(bytes, call);
    return {
      cancel: () => {
        if (over) return;
        over = true;
        clearTimeout(timer);
        conn.destroy(); // the server sees the connection go and drops the call
      },
    };
  }

  close() {
    this.closed = true;
    for (const conn of this.idle.splice(0)) conn.destroy();
  }
}

module.exports = { ConnectTransport, splitTarget, parseAnswer, errorFromAnswer, rpcError, SERVICE };
