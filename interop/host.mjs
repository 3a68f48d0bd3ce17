// Connects to one MCP server as an agent host does from one server entry
// of its configuration, given as JSON in argv[2]: {command, args, env}, a
// local command it starts and speaks to on stdin/stdout (the official
// TypeScript SDK's StdioClientTransport, as Claude Desktop, Cursor, Codex
// and Zed start one), or {url, headers}, Streamable HTTP. Prints
// {connected: {protocolVersion, serverInfo, capabilities, instructions}},
// then does what each line of its stdin asks, one at a time:
//   {"op":"list"}                      {list: {pages: [{size, nextCursor}], tools}}
//   {"op":"call","name","arguments"}   {outcome}
//   {"op":"stream","name","arguments","frames"}
//                                      {progress} for each progress notification;
//                                      after that many, the call is aborted
//                                      (AbortController): {aborted: true}, then
//                                      {outcome} once callTool settles
// and, whenever one comes, {listChanged: true} for each
// notifications/tools/list_changed. When its stdin ends it closes the
// client (a stdio server's stdin ends with it) and prints {closed: true}.
import readline from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { main, outcome, print } from './lib.mjs';

function transportOf(server) {
	if (server.command) {
		// stderr inherited: the server's log lands in this process's.
		return new StdioClientTransport({ command: server.command, args: server.args ?? [], env: server.env, stderr: 'inherit' });
	}
	if (server.url) {
		return new StreamableHTTPClientTransport(new URL(server.url), { requestInit: { headers: server.headers ?? {} } });
	}
	throw new Error(`a server entry needs a command or a url: ${JSON.stringify(server)}`);
}

async function list(client) {
	const pages = [];
	const tools = [];
	let cursor;
	do {
		if (pages.length >= 100) throw new Error('more than 100 pages: a cursor that never ends?');
		const page = await client.listTools(cursor === undefined ? {} : { cursor });
		pages.push({ size: page.tools.length, nextCursor: page.nextCursor ?? null });
		tools.push(...page.tools);
		cursor = page.nextCursor;
	} while (cursor);
	return { pages, tools };
}

async function stream(client, op) {
	const controller = new AbortController();
	let seen = 0;
	let reached;
	const enough = new Promise((resolve) => (reached = resolve));
	const call = outcome(
		client.callTool({ name: op.name, arguments: op.arguments }, undefined, {
			signal: controller.signal,
			onprogress: (p) => {
				print({ progress: { progress: p.progress, message: p.message } });
				if (++seen === op.frames) reached();
			},
			resetTimeoutOnProgress: true,
		}),
	);
	if ((await Promise.race([enough.then(() => 'frames'), call.then(() => 'ended')])) === 'frames') {
		controller.abort();
		print({ aborted: true });
	}
	print({ outcome: await call });
}

main(async () => {
	const server = JSON.parse(process.argv[2]);
	const client = new Client({ name: 'okso-interop-host', version: '1.0.0' });
	client.setNotificationHandler(ToolListChangedNotificationSchema, () => print({ listChanged: true }));
	await client.connect(transportOf(server));
	print({
		connected: {
			protocolVersion: client.transport?.protocolVersion ?? null,
			serverInfo: client.getServerVersion(),
			capabilities: client.getServerCapabilities(),
			instructions: client.getInstructions() ?? null,
		},
	});
	for await (const line of readline.createInterface({ input: process.stdin })) {
		if (!line.trim()) continue;
		const op = JSON.parse(line);
		switch (op.op) {
			case 'list':
				print({ list: await list(client) });
				break;
			case 'call':
				print({ outcome: await outcome(client.callTool({ name: op.name, arguments: op.arguments })) });
				break;
			case 'stream':
				await stream(client, op);
				break;
			default:
				throw new Error(`unknown op ${line}`);
		}
	}
	await client.close();
	print({ closed: true });
});
