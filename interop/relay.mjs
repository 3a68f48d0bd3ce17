// The listening side of the caller-tool relay (README, Agents' own
// tools), as an agent built on the official TypeScript SDK runs it: it
// offers the tool upper ({text} → {text: TEXT}) as caller "ts" with
// caller_tools_listen, a call it keeps open with onprogress (so the SDK
// sends a progressToken and the relay's events come as progress
// notifications), and answers each caller_tool_request with
// caller_tool_response: through the same client, or through a second
// client of the same token when argv[2] ({answer, ignore}) says
// answer: "second". A request whose text is in ignore is left unanswered.
//
// Prints one JSON line per event:
//   {ready: {listen_id, tools}}  the listen is open
//   {ignored: request_id}        a request it leaves unanswered
//   {ended: outcome}             the listen call ended by itself
// On a line on its stdin, or its end, it cancels the listen (the SDK sends
// notifications/cancelled), once its answers in flight are in, and prints
// {done: {requests, texts, accepted, refused, listen}}: how many requests
// it saw, the text argument of each, how many answers the gateway
// accepted, the results of those it refused, and how the listen call came
// to end. Its clients stay connected until its stdin ends.
import { createInterface } from 'node:readline';
import { connect, main, outcome, print } from './lib.mjs';

// What it declares: one tool, upper, with a required string argument.
const declaration = {
	caller_id: 'ts',
	tools: [
		{
			name: 'upper',
			description: 'Returns the text in upper case.',
			inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
		},
	],
};

// An open listen is one long request: no request timeout of the SDK's
// (60 s by default) may cut it. Each event resets the timer too.
const listenTimeoutMs = 60 * 60 * 1000;

main(async () => {
	const { answer = 'same', ignore = [] } = JSON.parse(process.argv[2] ?? '{}');
	const { client } = await connect();
	const answerer = answer === 'second' ? (await connect()).client : client;

	const seen = new Set();
	const texts = [];
	const answers = [];
	let accepted = 0;
	const refused = [];
	let listenID;

	const onEvent = (ev) => {
		if (ev.type === 'caller_tools_ready') {
			listenID = ev.listen_id;
			print({ ready: { listen_id: ev.listen_id, tools: ev.tools } });
			return;
		}
		if (ev.type !== 'caller_tool_request' || seen.has(ev.request_id)) return;
		seen.add(ev.request_id);
		const text = ev.arguments?.text;
		texts.push(text);
		if (ignore.includes(text)) {
			print({ ignored: ev.request_id });
			return;
		}
		const reply =
			typeof text === 'string' ? { result: { text: text.toUpperCase() } } : { error: 'text is not a string' };
		answers.push(
			outcome(
				answerer.callTool({
					name: 'caller_tool_response',
					arguments: { listen_id: listenID, request_id: ev.request_id, ...reply },
				}),
			).then((o) => {
				if (o.result && !o.result.isError) accepted++;
				else refused.push(o);
			}),
		);
	};

	const controller = new AbortController();
	const listen = outcome(
		client.callTool({ name: 'caller_tools_listen', arguments: declaration }, undefined, {
			signal: controller.signal,
			onprogress: (p) => {
				let ev;
				try {
					ev = JSON.parse(p.message ?? '');
				} catch {
					return;
				}
				onEvent(ev);
			},
			timeout: listenTimeoutMs,
			resetTimeoutOnProgress: true,
		}),
	);
	let stopping = false;
	listen.then((o) => {
		if (!stopping) print({ ended: o });
	});

	// A line on stdin, or its end, cancels the listen; the clients stay
	// connected until stdin ends.
	const input = createInterface({ input: process.stdin });
	const ends = new Promise((resolve) => input.on('close', resolve));
	await Promise.race([new Promise((resolve) => input.once('line', resolve)), ends]);
	// Answers first, while the listen they answer is open.
	for (let n = 0; n < answers.length; n = answers.length) await Promise.all(answers);
	stopping = true;
	controller.abort();
	const ended = await listen;
	print({ done: { requests: seen.size, texts, accepted, refused, listen: ended } });
	await ends;
	await client.close();
	if (answerer !== client) await answerer.close();
});
