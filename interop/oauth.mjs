// Signs in to okso's own authorization server with the official
// TypeScript SDK's OAuth support (an OAuthClientProvider given to the
// transport as its authProvider), headless: the provider's
// redirectToAuthorization opens the authorize page, this script prints
// the request's code ({"user_code"}) and waits for a line on stdin (the
// test runs okso oauth approve meanwhile), then presses Continue and
// follows the redirect to collect the code, as a browser would.
//
// Environment: OKSO_URL (the MCP endpoint), OKSO_TOKEN_ORIGIN (the origin
// to which every request of the token endpoint is sent: another gateway
// replica behind the same public URL, as a load balancer would send it),
// OKSO_REDIRECT (the redirect URI), OKSO_CIMD_URL (optional: sign in with
// that Client ID Metadata Document instead of registering), OKSO_TOOL (a
// tool to call). Prints what it saw, one JSON line per step, and
// {"done": {...}} at the end.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { auth, UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';
import { createInterface } from 'node:readline';
import { env, main, print } from './lib.mjs';

const url = new URL(env('OKSO_URL'));
const tokenOrigin = env('OKSO_TOKEN_ORIGIN');
const redirect = env('OKSO_REDIRECT');
const cimd = process.env.OKSO_CIMD_URL;

// The load balancer: token requests go to the other replica.
const tokenRequests = [];
async function lbFetch(input, init) {
	const u = new URL(input instanceof Request ? input.url : input);
	if (u.pathname === '/oauth/token') {
		const body = init?.body?.toString() ?? '';
		tokenRequests.push(new URLSearchParams(body).get('grant_type'));
		const moved = new URL(u.pathname + u.search, tokenOrigin);
		return fetch(moved, init);
	}
	return fetch(input, init);
}

class Provider {
	constructor() {
		this.client = undefined;
		this.saved = undefined;
		this.verifier = undefined;
		this.authURL = undefined;
	}
	get redirectUrl() { return redirect; }
	get clientMetadataUrl() { return cimd; }
	get clientMetadata() {
		return {
			client_name: 'okso interop (TS SDK)',
			redirect_uris: [redirect],
			grant_types: ['authorization_code', 'refresh_token'],
			response_types: ['code'],
			token_endpoint_auth_method: 'none',
		};
	}
	state() { return 'interop-state'; }
	clientInformation() { return this.client; }
	saveClientInformation(c) { this.client = c; }
	tokens() { return this.saved; }
	saveTokens(t) { this.saved = t; }
	redirectToAuthorization(u) { this.authURL = u; }
	saveCodeVerifier(v) { this.verifier = v; }
	codeVerifier() { return this.verifier; }
}

// lines reads stdin a line at a time.
const stdin = createInterface({ input: process.stdin });
const lineIter = stdin[Symbol.asyncIterator]();
async function nextLine() {
	const { value, done } = await lineIter.next();
	if (done) throw new Error('stdin closed');
	return value;
}

// browse is the user's browser on the authorize page: it opens it, says
// which request code it shows, waits for the operator, and presses
// Continue; it returns the redirect it is sent to.
async function browse(authURL) {
	const page = await fetch(authURL, { redirect: 'manual' });
	const html = await page.text();
	if (page.status !== 200) throw new Error(`authorize page: ${page.status} ${html}`);
	const csp = page.headers.get('content-security-policy') ?? '';
	const code = /class="code">([A-Z0-9]{4}-[A-Z0-9]{4})</.exec(html)?.[1];
	const csrf = /name="csrf" value="([^"]+)"/.exec(html)?.[1];
	const cookie = (page.headers.getSetCookie?.() ?? []).map((c) => c.split(';')[0]).join('; ');
	if (!code || !csrf || !cookie) throw new Error(`authorize page without code, CSRF token or cookie:\n${html}`);
	print({ user_code: code, csp, asks_secret: /type="password"/i.test(html) });
	await nextLine(); // approved
	const resp = await fetch(new URL(authURL.pathname, authURL), {
		method: 'POST',
		redirect: 'manual',
		headers: { 'content-type': 'application/x-www-form-urlencoded', cookie, origin: authURL.origin, 'sec-fetch-site': 'same-origin' },
		body: new URLSearchParams({ request: code, csrf, action: 'continue' }),
	});
	const loc = resp.headers.get('location');
	if (resp.status !== 303 || !loc) throw new Error(`continue: ${resp.status} ${await resp.text()}`);
	return new URL(loc);
}

main(async () => {
	const provider = new Provider();
	const transport = new StreamableHTTPClientTransport(url, { authProvider: provider, fetch: lbFetch });
	const client = new Client({ name: 'okso-interop-oauth', version: '1.0.0' });
	try {
		await client.connect(transport);
		throw new Error('connected without signing in');
	} catch (e) {
		if (!(e instanceof UnauthorizedError)) throw e;
	}
	if (!provider.authURL) throw new Error('the SDK never sent the user to the authorization server');
	const a = provider.authURL;
	print({
		authorize: {
			client_id: a.searchParams.get('client_id'),
			resource: a.searchParams.get('resource'),
			code_challenge_method: a.searchParams.get('code_challenge_method'),
		},
	});
	const back = await browse(a);
	if (back.searchParams.get('state') !== 'interop-state') throw new Error(`state came back as ${back.searchParams.get('state')}`);
	print({ redirect: { iss: back.searchParams.get('iss'), has_code: !!back.searchParams.get('code') } });
	await transport.finishAuth(back.searchParams.get('code'));
	const first = provider.tokens();

	// Signed in: a tool call with the access token.
	const t2 = new StreamableHTTPClientTransport(url, { authProvider: provider, fetch: lbFetch });
	const c2 = new Client({ name: 'okso-interop-oauth', version: '1.0.0' });
	await c2.connect(t2);
	const { tools } = await c2.listTools();
	const tool = tools.find((t) => t.name === process.env.OKSO_TOOL) ?? tools[0];
	const result = await c2.callTool({ name: tool.name, arguments: { message: 'hello' } });
	print({ call: { tool: tool.name, isError: !!result.isError } });
	await c2.close();

	// A refresh, with the SDK's own auth(): it rotates the refresh token.
	const r = await auth(provider, { serverUrl: url, fetchFn: lbFetch });
	const second = provider.tokens();
	print({ refresh: { result: r, rotated: second.refresh_token !== first.refresh_token, new_access: second.access_token !== first.access_token } });

	// The refresh token is no bearer token.
	const asBearer = await fetch(url, {
		method: 'POST',
		headers: { authorization: `Bearer ${second.refresh_token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
		body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} }),
	});
	// The spent refresh token, again: the family is revoked.
	const tokenURL = new URL('/oauth/token', tokenOrigin);
	const reuse = await fetch(tokenURL, {
		method: 'POST',
		headers: { 'content-type': 'application/x-www-form-urlencoded' },
		body: new URLSearchParams({ grant_type: 'refresh_token', refresh_token: first.refresh_token, client_id: provider.client.client_id }),
	});
	const newest = await fetch(tokenURL, {
		method: 'POST',
		headers: { 'content-type': 'application/x-www-form-urlencoded' },
		body: new URLSearchParams({ grant_type: 'refresh_token', refresh_token: second.refresh_token, client_id: provider.client.client_id }),
	});
	print({
		done: {
			client_id: provider.client.client_id,
			token_requests: tokenRequests,
			refresh_as_bearer: asBearer.status,
			reuse: { status: reuse.status, error: (await reuse.json()).error },
			newest_after_reuse: { status: newest.status, error: (await newest.json()).error },
		},
	});
	stdin.close();
});
