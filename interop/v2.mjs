// The official TypeScript SDK's v2 client (@modelcontextprotocol/client),
// as an application runs it: Streamable HTTP, the bearer token from an
// authProvider, and one of its protocol negotiation modes. argv[2] is
// {negotiation, scenario, ...}: negotiation is null (no
// versionNegotiation option: the client's default, legacy), "auto" or
// {pin: "2026-07-28"}; scenario is one of
//
//   calls   {calls: [{name, arguments}]}: calls the tools one after the
//           other and prints {outcomes: [{result} | {error}...]}
//   stream  {tool, arguments, frames}: calls a streaming tool with
//           onprogress and prints {progress: {progress, message}} per
//           frame; after the number of frames given it aborts the call
//           (AbortController signal on callTool) and prints {aborted:
//           true}, then {outcome} once callTool settles
//   relay   {caller_id}: the caller-tool relay between two clients of
//           this mode, watched over subscriptions/listen; prints {relay}
//           (see relay below)
//
// Every scenario first prints {session: {protocolVersion, era,
// listChanged, tools}}: what connect negotiated, whether the server
// declares tools.listChanged, and the names of every tool listed (the
// client keeps that list to check each result's structuredContent against
// its tool's outputSchema). Calls name tools in their canonical dotted
// form; the script calls each by the name the list shows for it, that or
// its safe form (every '.' a '-', DESIGN §8).
//
// Afterwards it holds on, with its clients connected, until its stdin
// ends. Environment: OKSO_URL, OKSO_TOKEN, OKSO_CALLER_TOKEN (relay: the
// calling agent's), OKSO_REQUEST_ID (sent as X-Request-Id).
//
// An exception the client throws is printed as {error: {name, code |
// sdkCode, message, data}}: a ProtocolError's JSON-RPC code is a number
// (code), an SdkError's code a string (sdkCode).
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { env, main, print } from './lib.mjs';

const { negotiation, scenario, ...args } = JSON.parse(process.argv[2]);

// How long the script waits for any one thing okso should do at once.
const waitMs = 20_000;

async function connect(token) {
	const headers = {};
	if (process.env.OKSO_REQUEST_ID) headers['X-Request-Id'] = process.env.OKSO_REQUEST_ID;
	const transport = new StreamableHTTPClientTransport(new URL(env('OKSO_URL')), {
		authProvider: { token: async () => token },
		requestInit: { headers },
	});
	const options = negotiation === null ? {} : { versionNegotiation: { mode: negotiation } };
	const client = new Client({ name: 'okso-interop-v2', version: '1.0.0' }, options);
	await client.connect(transport);
	return client;
}

// listedName is the name under which tools lists a tool of this canonical
// name, or undefined.
function listedName(tools, canonical) {
	const safe = canonical.replaceAll('.', '-');
	return tools.find((t) => t.name === canonical || t.name === safe)?.name;
}

async function outcome(promise) {
	try {
		return { result: await promise };
	} catch (e) {
		const error = { name: e?.name, message: e?.message, data: e?.data };
		if (typeof e?.code === 'number') error.code = e.code;
		else if (e?.code !== undefined) error.sdkCode = String(e.code);
		return { error };
	}
}

// events counts something that happens (a notification) and lets a
// caller wait, within a time bound, for the next one after a count it saw.
function events() {
	let count = 0;
	let waiters = [];
	return {
		get count() {
			return count;
		},
		fire() {
			count++;
			for (const w of waiters.splice(0)) w();
		},
		// after resolves true once count exceeds seen, false after ms.
		after(seen, ms) {
			if (count > seen) return Promise.resolve(true);
			return new Promise((resolve) => {
				const timer = setTimeout(() => resolve(false), ms);
				waiters.push(() => {
					clearTimeout(timer);
					resolve(true);
				});
			});
		},
	};
}

// ticks fires every ms while it runs: the "notification" of a client
// that has none and must poll.
function ticks(ms) {
	const e = events();
	const timer = setInterval(() => e.fire(), ms);
	e.stop = () => clearInterval(timer);
	return e;
}

// untilListed lists the tools each time changes fires, until name is
// listed (want true) or no longer (want false), within ms. It returns
// whether that came, and how many listings it took.
async function untilListed(client, canonical, want, changes, ms) {
	const deadline = Date.now() + ms;
	for (let listings = 1; listings <= 1000; listings++) {
		const seen = changes.count;
		// A listing of the server's, never the client's cache.
		const { tools } = await client.listTools(undefined, { cacheMode: 'refresh' });
		if ((listedName(tools, canonical) !== undefined) === want) return { ok: true, listings };
		const left = deadline - Date.now();
		if (left <= 0 || !(await changes.after(seen, left))) return { ok: false, listings };
	}
	return { ok: false, listings: 1000 };
}

async function session(client) {
	const { tools } = await client.listTools();
	print({
		session: {
			protocolVersion: client.getNegotiatedProtocolVersion(),
			era: client.getProtocolEra(),
			listChanged: client.getServerCapabilities()?.tools?.listChanged === true,
			tools: tools.map((t) => t.name),
		},
	});
	return tools;
}

async function calls(client, tools) {
	const outcomes = [];
	for (const c of args.calls) {
		const name = listedName(tools, c.name) ?? c.name;
		outcomes.push(await outcome(client.callTool({ name, arguments: c.arguments })));
	}
	print({ outcomes });
}

async function stream(client, tools) {
	const controller = new AbortController();
	let seen = 0;
	let reached;
	const enough = new Promise((resolve) => (reached = resolve));
	const call = outcome(
		client.callTool({ name: listedName(tools, args.tool) ?? args.tool, arguments: args.arguments }, {
			signal: controller.signal,
			onprogress: (p) => {
				print({ progress: { progress: p.progress, message: p.message } });
				if (++seen === args.frames) reached();
			},
			resetTimeoutOnProgress: true,
		}),
	);
	if ((await Promise.race([enough.then(() => 'frames'), call.then(() => 'ended')])) === 'ended') {
		print({ outcome: await call });
		return;
	}
	// On a 2025-era connection the client POSTs notifications/cancelled and
	// keeps the call's stream open; on a 2026-07-28 one it closes the
	// call's stream instead, the revision's cancellation signal.
	controller.abort();
	print({ aborted: true });
	print({ outcome: await call });
}

// relay runs the caller-tool relay (DESIGN §9.3) with two clients of this
// mode: the listener (OKSO_TOKEN) declares the tool upper as
// args.caller_id with caller_tools_listen, and answers each request with
// caller_tool_response; the caller (OKSO_CALLER_TOKEN) watches the tool
// list, calls {caller_id}_upper once it is listed, and watches it leave
// once the listener aborts its listen. On a 2026-07-28 connection the
// caller watches over subscriptions/listen and lists the tools only when
// notifications/tools/list_changed comes; on a 2025-era one, stateless,
// no stream can carry that notification, so it polls. Prints {relay:
// {listen, ready, requests, answers, appeared, called, listen_ended,
// left, subscription_closed}}, where appeared and left are {ok, listings,
// by: "list_changed" | "polling"}.
async function relay(caller) {
	const tool = `${args.caller_id}_upper`;
	const out = {};

	const changes = events();
	caller.setNotificationHandler('notifications/tools/list_changed', () => changes.fire());
	let subscription;
	if (caller.getProtocolEra() === 'modern') {
		const s = await outcome(caller.listen({ toolsListChanged: true }));
		if (s.error) {
			out.listen = s;
		} else {
			subscription = s.result;
			out.listen = { honoredFilter: subscription.honoredFilter };
		}
	} else {
		// The client refuses subscriptions/listen on a 2025-era connection.
		out.listen = await outcome(caller.listen({ toolsListChanged: true }));
	}
	// watch waits for the tool to be listed (or not): listing only when a
	// list_changed comes, while a subscription is open; failing that, by
	// polling, so that the rest of the relay is still tried.
	const watch = async (want) => {
		if (subscription) {
			const r = await untilListed(caller, tool, want, changes, waitMs);
			if (r.ok) return { ...r, by: 'list_changed' };
		}
		const poll = ticks(50);
		try {
			return { ...(await untilListed(caller, tool, want, poll, waitMs)), by: 'polling' };
		} finally {
			poll.stop();
		}
	};

	const listener = await connect(env('OKSO_TOKEN'));
	let ready;
	const isReady = new Promise((resolve) => (ready = resolve));
	let listenID;
	out.requests = [];
	const answers = [];
	const controller = new AbortController();
	const listen = outcome(
		listener.callTool(
			{
				name: 'caller_tools_listen',
				arguments: {
					caller_id: args.caller_id,
					tools: [
						{
							name: 'upper',
							description: 'Returns the text in upper case.',
							inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
						},
					],
				},
			},
			{
				signal: controller.signal,
				// An open listen is one long request; each event resets the timer.
				timeout: 10 * 60 * 1000,
				resetTimeoutOnProgress: true,
				onprogress: (p) => {
					let ev;
					try {
						ev = JSON.parse(p.message ?? '');
					} catch {
						return;
					}
					if (ev.type === 'caller_tools_ready') {
						listenID = ev.listen_id;
						ready({ listen_id: ev.listen_id, tools: ev.tools });
					} else if (ev.type === 'caller_tool_request') {
						out.requests.push(ev.arguments);
						const text = ev.arguments?.text;
						answers.push(
							outcome(
								listener.callTool({
									name: 'caller_tool_response',
									arguments: {
										listen_id: listenID,
										request_id: ev.request_id,
										result: { text: String(text).toUpperCase() },
									},
								}),
							),
						);
					}
				},
			},
		),
	);
	let timer;
	out.ready = await Promise.race([
		isReady,
		listen.then((o) => ({ ended: o })),
		new Promise((resolve) => (timer = setTimeout(() => resolve({ timeout: waitMs }), waitMs))),
	]);
	clearTimeout(timer);
	if (!out.ready.listen_id) {
		print({ relay: out });
		return;
	}

	out.appeared = await watch(true);
	if (out.appeared.ok) {
		const { tools } = await caller.listTools();
		out.called = await outcome(
			caller.callTool({ name: listedName(tools, tool), arguments: { text: 'Relay me' } }, { timeout: waitMs }),
		);
	}
	out.answers = await Promise.all(answers);

	controller.abort();
	out.listen_ended = await listen;
	out.left = await watch(false);
	if (subscription) {
		await subscription.close();
		out.subscription_closed = await subscription.closed;
	}
	await listener.close();
	print({ relay: out });
}

main(async () => {
	const token = scenario === 'relay' ? env('OKSO_CALLER_TOKEN') : env('OKSO_TOKEN');
	const client = await connect(token);
	const tools = await session(client);
	switch (scenario) {
		case 'calls':
			await calls(client, tools);
			break;
		case 'stream':
			await stream(client, tools);
			break;
		case 'relay':
			await relay(client);
			break;
		default:
			throw new Error(`unknown scenario ${scenario}`);
	}
	process.stdin.resume();
	await new Promise((resolve) => process.stdin.on('end', resolve));
	await client.close();
});
