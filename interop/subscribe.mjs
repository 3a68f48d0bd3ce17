// Calls a streaming tool with onprogress and prints one JSON line per
// event: {progress: {progress, message}} for each frame, then, after the
// number of frames given, what argv[2] says ({tool, arguments, frames,
// then}) to do:
//   abort  abort the call (AbortController signal on callTool): prints
//          {aborted: true}, then {outcome} once callTool settles
//   close  close the transport: prints {closed: true}
//   wait   nothing: prints {waiting: true} (the test kills this process)
// Afterwards it holds on, with the transport open unless closed, until its
// stdin ends.
import { connect, listAll, main, outcome, print } from './lib.mjs';

main(async () => {
	const { tool, arguments: args, frames, then } = JSON.parse(process.argv[2]);
	const { client, transport } = await connect();
	await listAll(client);
	const controller = new AbortController();
	let seen = 0;
	let reached;
	const enough = new Promise((resolve) => (reached = resolve));
	const call = outcome(
		client.callTool({ name: tool, arguments: args }, undefined, {
			signal: controller.signal,
			onprogress: (p) => {
				print({ progress: { progress: p.progress, message: p.message } });
				if (++seen === frames) reached();
			},
			resetTimeoutOnProgress: true,
		}),
	);
	const first = await Promise.race([enough.then(() => 'frames'), call.then(() => 'ended')]);
	if (first === 'ended') {
		print({ outcome: await call });
	} else {
		switch (then) {
			case 'abort':
				controller.abort();
				print({ aborted: true });
				print({ outcome: await call });
				break;
			case 'close':
				await transport.close();
				print({ closed: true });
				break;
			default:
				print({ waiting: true });
		}
	}
	process.stdin.resume();
	await new Promise((resolve) => process.stdin.on('end', resolve));
});
