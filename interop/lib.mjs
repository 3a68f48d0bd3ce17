// What every client script of this directory shares: a connected client of
// the official TypeScript SDK, the whole tool list, and outcomes printed as
// JSON for the Go tests (interop/*_test.go) to check.
//
// Environment: OKSO_URL (the MCP endpoint), OKSO_TOKEN (a bearer token) and,
// optionally, OKSO_REQUEST_ID (sent as X-Request-Id on every request, so
// that the test finds the call's audit events).
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

export function env(name) {
	const v = process.env[name];
	if (!v) throw new Error(`${name} is not set`);
	return v;
}

// connect returns a client that has initialized, as any application does:
// Streamable HTTP, the bearer token in requestInit.headers.
export async function connect() {
	const headers = { Authorization: `Bearer ${env('OKSO_TOKEN')}` };
	if (process.env.OKSO_REQUEST_ID) headers['X-Request-Id'] = process.env.OKSO_REQUEST_ID;
	const transport = new StreamableHTTPClientTransport(new URL(env('OKSO_URL')), { requestInit: { headers } });
	const client = new Client({ name: 'okso-interop', version: '1.0.0' });
	await client.connect(transport);
	return { client, transport };
}

// listAll follows nextCursor to the end. It returns every tool and the size
// of each page. (The SDK keeps the output-schema validators of the last
// page it listed only: callTool validates against them.)
export async function listAll(client) {
	const pages = [];
	const tools = [];
	let cursor;
	do {
		if (pages.length >= 100) throw new Error('more than 100 pages: a cursor that never ends?');
		const page = await client.listTools(cursor === undefined ? {} : { cursor });
		pages.push(page.tools.length);
		tools.push(...page.tools);
		cursor = page.nextCursor;
	} while (cursor);
	return { pages, tools };
}

// outcome is what a request came to: {result} or {error}, an exception
// thrown by the SDK (an McpError carries the JSON-RPC code and data).
export async function outcome(promise) {
	try {
		return { result: await promise };
	} catch (e) {
		return { error: { name: e?.name, code: e?.code, message: e?.message, data: e?.data } };
	}
}

export function print(v) {
	process.stdout.write(JSON.stringify(v) + '\n');
}

// main runs f and exits: 0 once f returned, 1 (with the error on stderr)
// if it threw; either way once what it printed is written (stdout is a
// pipe, written asynchronously: an early exit would cut it).
export function main(f) {
	const exit = (code) => process.stdout.write('', () => process.exit(code));
	f().then(
		() => exit(0),
		(e) => {
			process.stderr.write(`${e?.stack ?? e}\n`);
			exit(1);
		},
	);
}
