// The dashboard (README, The dashboard) as a person uses it, in a real
// headless Chromium driven by playwright-core: a wrong token refused,
// then the right one; the mock nodes listed; a node's metrics charted
// until at least two samples came; sysecho called through the form and
// its echo shown; that call in the audit feed; fleet.call's rows; and a
// caller tool and an upstream's tool whose descriptions hold markup
// shown as text, with no script run. Screenshots go to OKSO_ARTEFACTS.
//
// Environment: OKSO_UI (the dashboard's URL), OKSO_TOKEN (a read-only
// agent token), OKSO_CHROMIUM (the browser), OKSO_ARTEFACTS (a
// directory), OKSO_HOSTILE_TOOL (the caller tool with markup in its
// description), OKSO_HOSTILE_UPSTREAM (an upstream's tool, the same). Prints one JSON object: what the page showed.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { env, main, print } from './lib.mjs';

const step = 30_000; // the most any one step may take

main(async () => {
	const url = env('OKSO_UI');
	const token = env('OKSO_TOKEN');
	const artefacts = env('OKSO_ARTEFACTS');
	const hostile = env('OKSO_HOSTILE_TOOL');
	const profile = mkdtempSync(join(tmpdir(), 'okso-chromium-'));
	const out = { pageErrors: [], consoleErrors: [], dialogs: [], tokenInURL: [] };
	const context = await chromium.launchPersistentContext(profile, {
		executablePath: env('OKSO_CHROMIUM'),
		headless: true,
		args: [
			'--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
			'--disable-background-networking', '--disable-component-update', '--disable-sync',
		],
		viewport: { width: 1400, height: 1000 },
	});
	try {
		const page = context.pages()[0] ?? (await context.newPage());
		page.setDefaultTimeout(step);
		page.on('pageerror', (e) => out.pageErrors.push(String(e?.message ?? e)));
		page.on('console', (m) => {
			if (m.type() === 'error') out.consoleErrors.push(m.text());
		});
		page.on('dialog', (d) => {
			out.dialogs.push(d.message());
			d.dismiss().catch(() => {});
		});
		page.on('request', (r) => {
			if (r.url().includes(token.slice(-20))) out.tokenInURL.push(r.url());
		});

		const res = await page.goto(url);
		out.csp = res.headers()['content-security-policy'];

		// A wrong token: a real one with its signature spoiled.
		const spoiled = token.slice(0, -4) + (token.endsWith('AAAA') ? 'BBBB' : 'AAAA');
		await page.fill('#token', spoiled);
		await page.click('#signin-form button[type=submit]');
		await page.waitForFunction(() => document.getElementById('signin-error').textContent.includes('Refused'));
		out.refused = await page.textContent('#signin-error');
		out.refusedDashHidden = await page.isHidden('#dash');
		out.refusedStored = await page.evaluate(() => sessionStorage.getItem('okso.token'));
		await page.screenshot({ path: join(artefacts, 'refused.png') });

		// The token, pasted once.
		await page.fill('#token', token);
		await page.click('#signin-form button[type=submit]');
		await page.waitForSelector('#nodes-rows tr.node');
		out.stored = (await page.evaluate(() => sessionStorage.getItem('okso.token'))) === token;
		out.tokenInPage = (await page.content()).includes(token);
		out.who = await page.textContent('#who');
		out.nodes = await page.$$eval('#nodes-rows tr.node', (rows) => rows.map((r) => r.getAttribute('data-node')));
		out.presence = await page.$$eval('#nodes-rows tr.node', (rows) => rows.map((r) => r.cells[0].textContent));

		// The audit feed is live before anything is called.
		await page.waitForFunction(() => document.getElementById('audit-state').textContent.includes('live'));

		// A node's metrics, live.
		await page.click('#nodes-rows tr.node button.chart-btn');
		await page.waitForFunction(() => Number(document.getElementById('chart-samples').textContent) >= 2);
		out.samples = Number(await page.textContent('#chart-samples'));
		out.chartNode = await page.textContent('#chart-node');

		// sysecho, through the form made from its schema (the tools are
		// read by then: the form needs the schema).
		await page.waitForSelector('#tools-device li[data-tool]');
		await page.click('#nodes-rows tr.node button.call-btn');
		out.callTool = await page.inputValue('#call-tool');
		await page.fill('#call-args input[name=message]', 'hello from chromium');
		await page.click('#call-one');
		await page.waitForFunction(() => document.getElementById('call-status').textContent.includes('answered'));
		out.echo = JSON.parse(await page.textContent('#call-result'));
		out.callStatus = await page.textContent('#call-status');
		const id = out.callStatus.match(/request id (\S+)/)?.[1];
		out.echoRequestID = id;

		// That call in the audit feed.
		await page.waitForFunction(
			(id) => [...document.querySelectorAll('#audit-rows tr')].some((r) => r.textContent.includes(id) && r.textContent.includes('allowed')),
			id,
		);
		out.auditRow = await page.$$eval('#audit-rows tr', (rows, id) => rows.find((r) => r.textContent.includes(id))?.textContent, id);

		// A call the gateway refuses: its error envelope, shown.
		await page.fill('#call-tool', 'nosuch-tool');
		await page.dispatchEvent('#call-tool', 'change');
		await page.click('#call-one');
		await page.waitForSelector('#call-result.failed');
		out.refusedCall = JSON.parse(await page.textContent('#call-result'));
		await page.fill('#call-tool', out.callTool);
		await page.dispatchEvent('#call-tool', 'change');
		await page.fill('#call-args input[name=message]', 'hello from chromium');

		// fleet.call on every node, a row each.
		await page.click('#call-all');
		await page.waitForSelector('#fleet-rows tr');
		out.fleetRows = await page.$$eval('#fleet-rows tr', (rows) => rows.map((r) => [r.getAttribute('data-node'), r.cells[1].textContent]));
		out.fleetStatus = await page.textContent('#call-status');

		// The caller tool whose description is markup: shown as text, run never.
		await page.waitForSelector(`#tools-caller li[data-tool="${hostile}"]`);
		out.hostileListed = await page.textContent(`#tools-caller li[data-tool="${hostile}"]`);
		const upstream = env('OKSO_HOSTILE_UPSTREAM');
		await page.waitForSelector(`#tools-upstream li[data-tool="${upstream}"]`);
		out.upstreamListed = await page.textContent('#tools-upstream');
		await page.screenshot({ path: join(artefacts, 'dashboard.png'), fullPage: true });
		await page.click(`#tools-caller button[data-tool="${hostile}"]`);
		out.hostileDesc = await page.textContent('#call-desc');
		out.hostileElements = await page.evaluate(() => document.querySelectorAll('main img, main script, main iframe, main svg').length);
		out.pwned = await page.evaluate(() => typeof window.__pwned === 'undefined' ? null : window.__pwned);
		await page.screenshot({ path: join(artefacts, 'hostile.png'), fullPage: true });

		// 10,000 nodes: the gateway's fleet.nodes answers, made up here,
		// for a fleet of 10,000 (every fifth offline). The page holds one
		// page of rows, and pages and searches through fleet.nodes.
		const fleet = 10_000;
		const fakeID = (i) => `00000000000000${String(i).padStart(12, '0')}`.replace(/[ilou]/g, '0');
		out.bigRequests = [];
		await page.route('**/mcp/tools/call', async (route) => {
			const body = route.request().postDataJSON();
			if (body?.tool !== 'fleet.nodes') return route.continue();
			out.bigRequests.push(body.arguments);
			const a = body.arguments;
			const from = a.cursor ? Number(a.cursor.slice(14)) + 1 : 0;
			const nodes = [];
			for (let i = from; i < Math.min(fleet, from + a.limit); i++) {
				const offline = i % 5 === 4;
				nodes.push({
					node_id: fakeID(i), presence: offline ? 'offline' : 'online', name: `edge-${i}`, labels: { zone: 'b' },
					agent: { name: 'okso-mock', version: '1.0.0' }, connected_at: new Date().toISOString(),
					...(offline ? { last_seen: new Date(Date.now() - 3_600_000).toISOString() } : {}), tools: [],
				});
			}
			const next = from + a.limit < fleet ? { next_cursor: fakeID(from + a.limit - 1) } : {};
			await route.fulfill({ contentType: 'application/json', body: JSON.stringify({ nodes, total: fleet, ...next }) });
		});
		await page.fill('#nodes-query', 'zone=b');
		await page.click('#nodes-search button[type=submit]');
		await page.waitForFunction(() => document.getElementById('nodes-page').textContent.includes('of 10000'));
		await page.click('#nodes-next');
		await page.waitForFunction(() => document.getElementById('nodes-page').textContent.startsWith('51'));
		out.bigPage = await page.textContent('#nodes-page');
		out.bigRows = await page.$$eval('#nodes-rows tr', (rows) => rows.length);
		out.bigOffline = await page.$$eval('#nodes-rows tr.node.offline', (rows) => rows.map((r) => r.cells[5].textContent));
		out.bigTotal = await page.textContent('#nodes-total');
		await page.screenshot({ path: join(artefacts, 'fleet-10000.png') });
		await page.unroute('**/mcp/tools/call');

		// Sign out: the token leaves session storage.
		await page.click('#signout');
		await page.waitForSelector('#signin', { state: 'visible' });
		out.afterSignOut = await page.evaluate(() => sessionStorage.getItem('okso.token'));
		out.pwnedAtEnd = await page.evaluate(() => typeof window.__pwned === 'undefined' ? null : window.__pwned);
		print(out);
	} finally {
		await context.close();
		rmSync(profile, { recursive: true, force: true });
	}
});
