// api.js: how the dashboard talks to the gateway. The token lives in
// this tab's session storage and goes out as an Authorization header,
// never in a URL: streams are read with fetch, not EventSource (which
// cannot send a header). Every request names itself with X-Request-Id,
// so the audit feed can tell this page's background reads from the rest.

const tokenKey = 'okso.token';

export const token = {
	get: () => sessionStorage.getItem(tokenKey) || '',
	set: (t) => sessionStorage.setItem(tokenKey, t),
	clear: () => sessionStorage.removeItem(tokenKey),
};

const page = Array.from(crypto.getRandomValues(new Uint8Array(6)), (b) => b.toString(16).padStart(2, '0')).join('');
let seq = 0;

// backgroundPrefix begins the request id of every read this page makes
// by itself (polling), as opposed to what its user asked.
export const backgroundPrefix = `ui-bg-${page}-`;

function requestID(background) {
	seq++;
	return (background ? backgroundPrefix : `ui-${page}-`) + seq;
}

// Refused is a request the gateway answered with an error: status, the
// error envelope {code, category, message} when there is one, and the
// answer's text otherwise.
export class Refused extends Error {
	constructor(status, envelope, text, requestID) {
		super(envelope?.message || text || `HTTP ${status}`);
		this.status = status;
		this.envelope = envelope;
		this.text = text;
		this.requestID = requestID;
	}
}

// onUnauthorized is called with the gateway's sentence when it refuses
// the token (401).
let onUnauthorized = () => {};
export function whenUnauthorized(f) {
	onUnauthorized = f;
}

async function post(path, body, { accept = 'application/json', background = false, signal } = {}) {
	const id = requestID(background);
	const res = await fetch(path, {
		method: 'POST',
		headers: {
			Authorization: `Bearer ${token.get()}`,
			'Content-Type': 'application/json',
			Accept: accept,
			'X-Request-Id': id,
		},
		body: JSON.stringify(body),
		signal,
		credentials: 'omit',
		cache: 'no-store',
		referrerPolicy: 'no-referrer',
		redirect: 'error',
	});
	if (!res.ok) {
		const text = await res.text();
		let envelope;
		try {
			const j = JSON.parse(text);
			if (j && typeof j.code === 'string') envelope = j;
		} catch {
			// not JSON: the 401's sentence, or a proxy's page
		}
		const err = new Refused(res.status, envelope, text.trim(), res.headers.get('X-Request-Id') || id);
		if (res.status === 401) onUnauthorized(err.message);
		throw err;
	}
	return { res, requestID: res.headers.get('X-Request-Id') || id };
}

// whoami checks the token: its tenant, subject and scopes.
export async function whoami() {
	const { res } = await post('/ui/api/whoami', {});
	return res.json();
}

// call calls a unary tool through the REST door and returns its result
// and request id.
export async function call(tool, args, opts = {}) {
	const { res, requestID } = await post('/mcp/tools/call', { tool, arguments: args ?? {} }, opts);
	const text = await res.text();
	let result;
	try {
		result = JSON.parse(text);
	} catch {
		result = text;
	}
	return { result, requestID };
}

// stream opens a Server-Sent Events stream on path (a POST with body) and
// calls onEvent(event, data) for each event until it ends or signal
// aborts. It resolves when the stream ends. background marks it as the
// page's own (the audit feed), not its user's.
export async function stream(path, body, onEvent, signal, background = false) {
	const { res } = await post(path, body, { accept: 'text/event-stream', signal, background });
	const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
	let buf = '';
	for (;;) {
		const { value, done } = await reader.read();
		if (done) return;
		buf += value;
		let at;
		while ((at = buf.indexOf('\n\n')) >= 0) {
			const block = buf.slice(0, at);
			buf = buf.slice(at + 2);
			let event = 'message';
			const data = [];
			for (const line of block.split('\n')) {
				if (line.startsWith('event:')) event = line.slice(6).trim();
				else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
			}
			let parsed;
			try {
				parsed = JSON.parse(data.join('\n'));
			} catch {
				continue;
			}
			onEvent(event, parsed);
		}
	}
}

// callStream calls a streaming tool (a metric subscription).
export function callStream(tool, args, onEvent, signal) {
	return stream('/mcp/tools/call', { tool, arguments: args ?? {} }, onEvent, signal);
}
