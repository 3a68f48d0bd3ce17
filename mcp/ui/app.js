// app.js: the okso dashboard. Signs in with an agent token, then shows
// the tenant's nodes a page at a time (fleet.nodes: search and paging,
// never a row per node of the fleet), the tools of every source
// (okso.find_tools), a node's metrics live (its subscribe tool over the
// SSE door), a form to call any tool or fan it out (fleet.call), and the
// tenant's audit events as they come (/ui/api/audit). Everything a
// device, an upstream or another agent wrote is shown as text.

import * as api from './api.js';
import { $, el, append, clear, setText, ago } from './dom.js';
import { Chart } from './chart.js';
import { build } from './form.js';

const pageSize = 50; // nodes per page
const nodesEvery = 3000; // ms between two reads of the page of nodes
const toolsEvery = 5000; // and of the tool lists
const auditKept = 200; // rows of the audit feed kept on the page
const fleetRowsShown = 500;

const state = {
	signedIn: false,
	who: null,
	filters: {},
	presence: 'any',
	cursors: [undefined], // cursors[i] gets page i
	page: 0,
	nodes: new Map(), // node id → node, of the page shown
	nodesSignature: '', // of the page shown
	tools: { byName: new Map(), byPattern: new Map(), signature: '' },
	timers: [],
	aborts: new Set(), // every stream and loop of the signed-in page
	chart: null, // the chart's AbortController
	audit: [], // the last events, newest first
	chosen: '', // the name the call form is for
	describe: null, // its descriptor, if found
	readArgs: () => ({}),
	plan: null, // fleet.call arguments awaiting their plan's run
};

const nodeIDRe = /^[0-9a-hjkmnp-tv-z]{1,26}$/;

// ---- sign in and out ----

async function signIn(tok) {
	api.token.set(tok);
	try {
		state.who = await api.whoami();
	} catch (e) {
		api.token.clear();
		throw e;
	}
	state.signedIn = true;
	setText($('who'), `tenant ${state.who.tenant} · ${state.who.subject} · ${state.who.scopes.join(' ')}`);
	$('signin').hidden = true;
	$('dash').hidden = false;
	$('signout').hidden = false;
	setText($('signin-error'), '');
	refreshNodes();
	refreshTools();
	state.timers.push(setInterval(() => refreshNodes(true), nodesEvery));
	state.timers.push(setInterval(() => refreshTools(true), toolsEvery));
	followAudit();
}

function signOut(why = '') {
	api.token.clear();
	state.signedIn = false;
	state.who = null;
	for (const t of state.timers) clearInterval(t);
	state.timers = [];
	for (const a of state.aborts) a.abort();
	state.aborts.clear();
	stopChart();
	state.audit = [];
	state.nodes.clear();
	state.nodesSignature = '';
	state.tools = { byName: new Map(), byPattern: new Map(), signature: '' };
	for (const id of ['nodes-rows', 'audit-rows', 'fleet-rows', 'call-tools', 'tools-device', 'tools-upstream', 'tools-caller', 'tools-okso']) clear($(id));
	for (const id of ['who', 'call-result', 'call-status', 'nodes-total', 'nodes-page', 'audit-state', 'call-desc']) setText($(id), '');
	$('call-tool').value = '';
	state.chosen = '';
	state.describe = null;
	$('dash').hidden = true;
	$('signout').hidden = true;
	$('signin').hidden = false;
	setText($('signin-error'), why);
	$('token').focus();
}

api.whenUnauthorized((sentence) => {
	if (state.signedIn) signOut(`The gateway refused the token: ${sentence}`);
});

// ---- nodes ----

function parseQuery(q) {
	const f = {};
	for (const tok of q.split(/\s+/).filter(Boolean)) {
		const colon = tok.indexOf(':');
		const eq = tok.indexOf('=');
		if (eq > 0 && (colon < 0 || eq < colon)) {
			f.labels = { ...(f.labels || {}), [tok.slice(0, eq)]: tok.slice(eq + 1) };
		} else if (colon > 0) {
			const k = tok.slice(0, colon);
			const v = tok.slice(colon + 1);
			const key = { agent: 'agent', kind: 'kind', cap: 'cap_id', cap_id: 'cap_id', verb: 'verb', name: 'name' }[k];
			if (!key) throw new Error(`unknown filter ${k}: (agent:, kind:, cap:, verb:, name:)`);
			f[key] = v;
		} else if (nodeIDRe.test(tok)) {
			f.node_id_prefix = tok;
		} else {
			f.name = tok;
		}
	}
	return f;
}

let nodesInFlight = false;

async function refreshNodes(background = false) {
	if (!state.signedIn || (background && nodesInFlight)) return;
	nodesInFlight = true;
	const args = { ...state.filters, presence: state.presence, limit: pageSize };
	const cursor = state.cursors[state.page];
	if (cursor) args.cursor = cursor;
	try {
		const { result } = await api.call('fleet.nodes', args, { background });
		setText($('nodes-error'), '');
		renderNodes(result);
	} catch (e) {
		if (state.signedIn) setText($('nodes-error'), `fleet.nodes: ${describeError(e)}`);
	} finally {
		nodesInFlight = false;
	}
}

function seenText(n) {
	if (n.presence === 'online') return n.connected_at ? `online since ${ago(n.connected_at)}` : 'online';
	return n.last_seen ? ago(n.last_seen) : '';
}

function renderNodes(r) {
	const rows = $('nodes-rows');
	const nodes = Array.isArray(r?.nodes) ? r.nodes : [];
	state.nodes = new Map(nodes.map((n) => [n.node_id, n]));
	// The same page as last time: only the times move. Rows are not
	// replaced under a pointer about to click one of their buttons.
	const signature = JSON.stringify([r?.total, r?.next_cursor, nodes]);
	if (signature === state.nodesSignature) {
		for (const tr of rows.querySelectorAll('tr.node')) {
			const n = state.nodes.get(tr.getAttribute('data-node'));
			if (n) setText(tr.cells[5], seenText(n));
		}
		return;
	}
	state.nodesSignature = signature;
	const trs = nodes.map((n) => {
		const online = n.presence === 'online';
		const labels = Object.entries(n.labels || {}).map(([k, v]) => el('span', { class: 'label' }, `${k}=${v}`));
		const seen = seenText(n);
		const subscribe = metricsTool(n);
		const actions = el('td', {});
		if (online && subscribe) actions.appendChild(el('button', { type: 'button', class: 'chart-btn', 'data-node': n.node_id }, 'Chart'));
		if (online && n.tools?.length) actions.appendChild(el('button', { type: 'button', class: 'call-btn', 'data-node': n.node_id }, 'Call'));
		return el(
			'tr',
			{ class: `node ${n.presence}`, 'data-node': n.node_id },
			el('td', {}, el('span', { class: `dot ${online ? 'online' : 'offline'}` }), n.presence),
			el('td', { class: 'name' }, n.name || ''),
			el('td', { class: 'mono' }, n.node_id),
			el('td', {}, labels),
			el('td', {}, n.agent ? `${n.agent.name} ${n.agent.version}` : ''),
			el('td', {}, seen),
			actions,
		);
	});
	rows.replaceChildren(...trs);
	if (trs.length === 0) rows.appendChild(el('tr', {}, el('td', { colspan: 7, class: 'empty' }, 'No node matches.')));
	const total = typeof r?.total === 'number' ? r.total : nodes.length;
	setText($('nodes-total'), `(${total})`);
	const from = state.page * pageSize + (nodes.length ? 1 : 0);
	setText($('nodes-page'), `${from}–${state.page * pageSize + nodes.length} of ${total}`);
	state.cursors.length = state.page + 1;
	if (r?.next_cursor) state.cursors.push(r.next_cursor);
	$('nodes-prev').disabled = state.page === 0;
	$('nodes-next').disabled = !r?.next_cursor;
}

// segments splits a device tool name in either form ({kind}.{node}.{cap}.{verb}
// or its safe form with '-'): a client may read a name okso listed.
function segments(name) {
	const sep = name.includes('.') ? '.' : '-';
	const parts = name.split(sep);
	return parts.length === 4 ? { sep, parts } : null;
}

function metricsTool(n) {
	return (n.tools || []).find((t) => {
		const s = segments(t);
		return s && s.parts[0] === 'sys' && s.parts[3] === 'subscribe';
	});
}

function patternOf(name) {
	const s = segments(name);
	if (!s) return '';
	const p = [...s.parts];
	p[1] = '*';
	return p.join(s.sep);
}

$('nodes-search').addEventListener('submit', (ev) => {
	ev.preventDefault();
	try {
		state.filters = parseQuery($('nodes-query').value);
	} catch (e) {
		setText($('nodes-error'), e.message);
		return;
	}
	state.presence = $('nodes-presence').value;
	state.cursors = [undefined];
	state.page = 0;
	refreshNodes();
});
$('nodes-presence').addEventListener('change', () => $('nodes-search').requestSubmit());
$('nodes-prev').addEventListener('click', () => {
	if (state.page > 0) {
		state.page--;
		refreshNodes();
	}
});
$('nodes-next').addEventListener('click', () => {
	if (state.cursors[state.page + 1]) {
		state.page++;
		refreshNodes();
	}
});
$('nodes-rows').addEventListener('click', (ev) => {
	const b = ev.target.closest('button');
	if (!b) return;
	const n = state.nodes.get(b.getAttribute('data-node'));
	if (!n) return;
	if (b.classList.contains('chart-btn')) openChart(n);
	if (b.classList.contains('call-btn')) offerNodeTools(n);
});

// ---- metrics chart ----

const chart = new Chart($('chart-canvas'));

function stopChart() {
	if (state.chart) {
		state.chart.abort();
		state.aborts.delete(state.chart);
		state.chart = null;
	}
	$('chart').hidden = true;
}

function openChart(n) {
	stopChart();
	const tool = metricsTool(n);
	if (!tool) return;
	const abort = new AbortController();
	state.chart = abort;
	state.aborts.add(abort);
	$('chart').hidden = false;
	setText($('chart-node'), n.name ? `${n.name} (${n.node_id})` : n.node_id);
	chart.reset();
	let samples = 0;
	setText($('chart-samples'), '0');
	setText($('chart-status'), 'subscribing…');
	api
		.callStream(
			tool,
			{ interval_ms: 1000 },
			(event, data) => {
				if (event === 'metric') {
					samples++;
					chart.add(data);
					setText($('chart-samples'), String(samples));
					setText($('chart-status'), `live, load ${Number(data.load_1m).toFixed(2)}`);
				} else if (event === 'close') {
					setText($('chart-status'), `closed: ${data.code} ${data.reason}`);
				}
			},
			abort.signal,
		)
		.catch((e) => {
			if (!abort.signal.aborted) setText($('chart-status'), describeError(e));
		});
}

$('chart-stop').addEventListener('click', stopChart);

// ---- tools ----

let toolsInFlight = false;

async function refreshTools(background = false) {
	if (!state.signedIn || (background && toolsInFlight)) return;
	toolsInFlight = true;
	try {
		const all = [];
		let cursor;
		for (let page = 0; page < 10; page++) {
			const args = { limit: 100 };
			if (cursor) args.cursor = cursor;
			const { result } = await api.call('okso.find_tools', args, { background });
			all.push(...(result?.tools || []));
			cursor = result?.next_cursor;
			if (!cursor) break;
		}
		setText($('tools-error'), '');
		renderTools(all);
	} catch (e) {
		if (state.signedIn) setText($('tools-error'), `okso.find_tools: ${describeError(e)}`);
	} finally {
		toolsInFlight = false;
	}
}

function renderTools(all) {
	const signature = JSON.stringify(all.map((t) => [t.name, t.description, t.template?.nodes]));
	if (signature === state.tools.signature) return;
	const byName = new Map();
	const byPattern = new Map();
	const lists = { device: [], upstream: [], caller: [], okso: [] };
	for (const t of all) {
		byName.set(t.name, t);
		if (t.template?.pattern) byPattern.set(t.template.pattern, t);
		(lists[t.source] || lists.okso).push(t);
	}
	state.tools = { byName, byPattern, signature };
	for (const [source, tools] of Object.entries(lists)) {
		const ul = $(`tools-${source}`);
		const items = [];
		let group = '';
		for (const t of tools) {
			// Upstream tools by upstream ({upstream}.{tool}), caller tools by
			// caller ({caller_id}_{tool}).
			const g = source === 'upstream' ? t.name.split(/[.-]/)[0] : source === 'caller' ? t.name.split('_')[0] : '';
			if (g && g !== group) {
				group = g;
				items.push(el('li', { class: 'group' }, el('strong', {}, source === 'upstream' ? `upstream ${g}` : `caller ${g}`)));
			}
			const shown = t.template ? t.template.pattern : t.name;
			items.push(
				el(
					'li',
					{ 'data-tool': shown },
					el('button', { type: 'button', class: 'name', 'data-tool': shown }, shown),
					t.template ? ` · ${t.template.nodes} node${t.template.nodes === 1 ? '' : 's'}` : '',
					el('span', { class: 'tdesc' }, t.description || t.title || ''),
				),
			);
		}
		if (items.length === 0) items.push(el('li', { class: 'empty' }, 'none'));
		ul.replaceChildren(...items);
	}
	const dl = $('call-tools');
	dl.replaceChildren(...all.map((t) => el('option', { value: t.template ? t.template.pattern : t.name })));
	if (state.describe === null && $('call-tool').value) chooseTool($('call-tool').value);
}

for (const source of ['device', 'upstream', 'caller', 'okso']) {
	$(`tools-${source}`).addEventListener('click', (ev) => {
		const b = ev.target.closest('button.name');
		if (!b) return;
		$('call-tool').value = b.getAttribute('data-tool');
		chooseTool($('call-tool').value);
		$('call').scrollIntoView({ block: 'nearest' });
	});
}

// ---- call a tool ----

function offerNodeTools(n) {
	const dl = $('call-tools');
	dl.replaceChildren(...(n.tools || []).map((t) => el('option', { value: t })));
	const echo = (n.tools || []).find((t) => segments(t)?.parts[0] === 'sysecho') || n.tools[0];
	$('call-tool').value = echo;
	chooseTool(echo);
	$('call').scrollIntoView({ block: 'nearest' });
	$('call-tool').focus();
}

// descriptor finds a tool's descriptor: by name, or as a node's instance
// of a template, or a template's pattern itself.
function descriptor(name) {
	return state.tools.byName.get(name) || state.tools.byPattern.get(name) || state.tools.byPattern.get(patternOf(name)) || null;
}

// chooseTool makes the call form for the tool name: once per name, so
// that the change event a browser fires when the field loses focus (a
// click on a button of the form) does not rebuild the form under the
// click; again once the tool's descriptor is found.
function chooseTool(name) {
	const d = descriptor(name);
	if (name === state.chosen && d === state.describe) return;
	state.chosen = name;
	state.describe = d;
	state.plan = null;
	$('call-plan').hidden = true;
	const isPattern = name.includes('*');
	// A subscription streams: the chart shows it, and fleet.call refuses it.
	const streaming = segments(name)?.parts[3] === 'subscribe';
	const fanOut = Boolean(d && (d.template || d.source === 'device')) && !streaming;
	setText($('call-desc'), d ? [d.title, d.description].filter(Boolean).join(' — ') : name ? 'Not among the tools found: the call says why.' : '');
	state.readArgs = build($('call-args'), d?.inputSchema || { type: 'object' });
	$('call-one').hidden = isPattern;
	$('call-all').hidden = !fanOut;
	$('call-fleet').hidden = !fanOut;
}

$('call-tool').addEventListener('change', () => chooseTool($('call-tool').value.trim()));

function showResult(text, failed) {
	const pre = $('call-result');
	setText(pre, text);
	pre.classList.toggle('failed', failed);
}

function describeError(e) {
	if (e instanceof api.Refused) {
		if (e.envelope) return `${e.envelope.code} (${e.envelope.category}): ${e.envelope.message}`;
		return `HTTP ${e.status}: ${e.text}`;
	}
	return e?.message || String(e);
}

function readArgs() {
	try {
		return state.readArgs();
	} catch (e) {
		showResult(`arguments: ${e.message}`, true);
		return null;
	}
}

$('call-form').addEventListener('submit', async (ev) => {
	ev.preventDefault();
	const name = $('call-tool').value.trim();
	if (!name) return;
	const args = readArgs();
	if (!args) return;
	const s = segments(name);
	if (s?.parts[0] === 'sys' && s.parts[3] === 'subscribe' && !name.includes('*')) {
		const n = state.nodes.get(s.parts[1]) || { node_id: s.parts[1], tools: [name] };
		openChart(n);
		$('chart').scrollIntoView({ block: 'nearest' });
		return;
	}
	$('fleet-table').hidden = true;
	setText($('call-status'), `calling ${name}…`);
	showResult('', false);
	try {
		const { result, requestID } = await api.call(name, args);
		setText($('call-status'), `${name} answered · request id ${requestID}`);
		showResult(typeof result === 'string' ? result : JSON.stringify(result, null, 2), false);
	} catch (e) {
		setText($('call-status'), `${name} failed · request id ${e.requestID || ''}`);
		showResult(e.envelope ? JSON.stringify(e.envelope, null, 2) : describeError(e), true);
	}
});

async function fleetCall(args) {
	setText($('call-status'), `fleet.call ${args.tool}…`);
	showResult('', false);
	$('fleet-table').hidden = true;
	try {
		const { result, requestID } = await api.call('fleet.call', args);
		if (result?.dry_run) {
			state.plan = result.plan_id ? { ...args, dry_run: undefined, plan_id: result.plan_id } : null;
			$('call-plan').hidden = !state.plan;
			setText($('call-status'), `dry run · ${result.targeted} nodes, ${result.safety_class} · request id ${requestID}`);
			showResult(JSON.stringify(result, null, 2), false);
			return;
		}
		state.plan = null;
		$('call-plan').hidden = true;
		renderFleetRows(result);
		const s = result?.summary || {};
		const failed = Object.entries(s.failed || {}).map(([c, n]) => `${c} ${n}`).join(', ');
		setText($('call-status'), `fleet.call: ${s.targeted} targeted, ${s.ok} ok${failed ? `, failed: ${failed}` : ''} · request id ${requestID}`);
	} catch (e) {
		setText($('call-status'), `fleet.call failed · request id ${e.requestID || ''}`);
		showResult(e.envelope ? JSON.stringify(e.envelope, null, 2) : describeError(e), true);
	}
}

function renderFleetRows(r) {
	const rows = Array.isArray(r?.results) ? r.results : [];
	const trs = rows.slice(0, fleetRowsShown).map((row) =>
		el(
			'tr',
			{ class: row.ok ? 'ok' : 'bad', 'data-node': row.node_id },
			el('td', { class: 'mono' }, row.node_id),
			el('td', { class: row.ok ? 'ok' : 'bad' }, row.ok ? 'ok' : 'failed'),
			el('td', { class: 'mono' }, row.ok ? JSON.stringify(row.result ?? row.result_truncated ?? null) : `${row.error?.code}: ${row.error?.message}`),
		),
	);
	if (rows.length > fleetRowsShown) trs.push(el('tr', {}, el('td', { colspan: 3, class: 'empty' }, `${rows.length - fleetRowsShown} more rows not shown`)));
	$('fleet-rows').replaceChildren(...trs);
	$('fleet-table').hidden = false;
}

$('call-all').addEventListener('click', () => {
	const name = $('call-tool').value.trim();
	const pattern = name.includes('*') ? name : state.describe?.template?.pattern || patternOf(name);
	if (!pattern) return;
	const args = readArgs();
	if (!args) return;
	const call = { tool: pattern, arguments: args };
	let labels;
	try {
		labels = parseQuery($('call-selector').value).labels;
	} catch (e) {
		showResult(e.message, true);
		return;
	}
	if (labels) call.selector = { labels };
	if ($('call-dry').checked) call.dry_run = true;
	fleetCall(call);
});

$('call-plan').addEventListener('click', () => {
	if (state.plan) fleetCall(Object.fromEntries(Object.entries(state.plan).filter(([, v]) => v !== undefined)));
});

// ---- audit feed ----

function auditRow(e) {
	const t = new Date(e.time);
	return el(
		'tr',
		{ class: `decision-${e.decision}` },
		el('td', { class: 'mono nowrap' }, Number.isFinite(t.getTime()) ? t.toLocaleTimeString() : ''),
		el('td', {}, e.actor || ''),
		el('td', { class: `decision-${e.decision}` }, e.decision || ''),
		el('td', {}, e.code || ''),
		el('td', { class: 'mono' }, e.tool || e.upstream || ''),
		el('td', { class: 'mono' }, e.node_id || ''),
		el('td', {}, e.subject || ''),
		el('td', { class: 'mono' }, e.request_id || ''),
	);
}

function shown(e) {
	return $('audit-own').checked || !(e.request_id || '').startsWith(api.backgroundPrefix);
}

function renderAudit() {
	$('audit-rows').replaceChildren(...state.audit.filter(shown).slice(0, auditKept).map(auditRow));
}

$('audit-own').addEventListener('change', renderAudit);

let nodesSoon = 0;

function onAudit(e) {
	state.audit.unshift(e);
	if (state.audit.length > 4 * auditKept) state.audit.length = 4 * auditKept;
	if (e.decision === 'connected' || e.decision === 'disconnected') {
		clearTimeout(nodesSoon);
		nodesSoon = setTimeout(() => refreshNodes(true), 300);
	}
	if (!shown(e)) return;
	const rows = $('audit-rows');
	rows.insertBefore(auditRow(e), rows.firstChild);
	while (rows.childElementCount > auditKept) rows.lastElementChild.remove();
}

async function followAudit() {
	const abort = new AbortController();
	state.aborts.add(abort);
	let wait = 1000;
	while (!abort.signal.aborted) {
		setText($('audit-state'), '(connecting)');
		try {
			await api.stream(
				'/ui/api/audit',
				{},
				(event, data) => {
					if (event === 'ready') {
						wait = 1000;
						setText($('audit-state'), '(live)');
						setText($('audit-error'), '');
					} else if (event === 'audit') onAudit(data);
					else if (event === 'dropped') setText($('audit-error'), `${data.count} events dropped: this page fell behind`);
				},
				abort.signal,
				true,
			);
		} catch (e) {
			if (abort.signal.aborted) return;
			if (e instanceof api.Refused && (e.status === 401 || e.status === 403)) {
				setText($('audit-state'), '(off)');
				setText($('audit-error'), describeError(e));
				return;
			}
			setText($('audit-error'), describeError(e));
		}
		if (abort.signal.aborted) return;
		setText($('audit-state'), '(reconnecting)');
		await new Promise((resolve) => setTimeout(resolve, wait));
		wait = Math.min(wait * 2, 30000);
	}
}

// ---- start ----

$('signin-form').addEventListener('submit', async (ev) => {
	ev.preventDefault();
	const input = $('token');
	const tok = input.value.trim().replace(/^bearer\s+/i, '');
	input.value = '';
	if (!tok) return;
	try {
		await signIn(tok);
	} catch (e) {
		setText($('signin-error'), `Refused: ${describeError(e)}`);
	}
});
$('signout').addEventListener('click', () => signOut());

if (api.token.get()) {
	signIn(api.token.get()).catch((e) => signOut(`Refused: ${describeError(e)}`));
} else {
	$('token').focus();
}
