// Calls one tool (argv[2]: {name, arguments}) with onprogress, after
// listing every tool (so the SDK checks the result's structuredContent
// against the tool's outputSchema), and prints {progress: [{progress,
// total, message}...], outcome} once the call settled.
import { connect, listAll, main, outcome, print } from './lib.mjs';

main(async () => {
	const { name, arguments: args } = JSON.parse(process.argv[2]);
	const { client } = await connect();
	await listAll(client);
	const progress = [];
	const settled = await outcome(
		client.callTool({ name, arguments: args }, undefined, {
			onprogress: (p) => progress.push({ progress: p.progress, total: p.total, message: p.message }),
		}),
	);
	print({ progress, outcome: settled });
	await client.close();
});
