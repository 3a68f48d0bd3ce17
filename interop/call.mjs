// Lists every tool (so the SDK validates each result's structuredContent
// against its tool's outputSchema), then calls the tools given as a JSON
// array in argv[2], [{name, arguments}...], one after the other, or all at
// once with --concurrent. Prints {pages, outcomes: [{result} | {error}...]}
// in the order given.
import { connect, listAll, main, outcome, print } from './lib.mjs';

main(async () => {
	const calls = JSON.parse(process.argv[2] ?? '[]');
	const concurrent = process.argv.includes('--concurrent');
	const { client } = await connect();
	const { pages } = await listAll(client);
	const call = (c) => outcome(client.callTool({ name: c.name, arguments: c.arguments }));
	let outcomes = [];
	if (concurrent) {
		outcomes = await Promise.all(calls.map(call));
	} else {
		for (const c of calls) outcomes.push(await call(c));
	}
	print({ pages, outcomes });
	await client.close();
});
