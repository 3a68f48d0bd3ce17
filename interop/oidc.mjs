// A real OpenID provider (oidc-provider, the certified implementation)
// for the --oauth-issuers tests: it listens on 127.0.0.1 (an ephemeral
// port), prints {issuer}, then serves one command per line of stdin,
// answering each with one JSON line:
//
//   {"op":"token","client":"demo","resource":"api://okso","scope":"okso.read"}
//       -> {"token": "..."}  a JWT access token, got at its own token
//          endpoint by the client credentials grant for that resource
//          (RFC 8707): its aud is the resource
//   {"op":"rotate"} -> {"kid": "..."}  a new signing key (Ed25519, signing
//          EdDSA from then on) put first in the key set, the old one kept
//
// Clients: demo, globex and initech, whose tokens carry their own name in
// the claim org (the tenant, for okso). The issuer is
// http://127.0.0.1:PORT. oidc-provider serves plain http as it is (a
// deployment puts TLS in front of it); nothing about it is test-only, and
// okso fetches discovery and keys over plain http from loopback
// addresses only.
import { generateKeyPairSync, randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import { createInterface } from 'node:readline';
import Provider from 'oidc-provider';

const clients = ['demo', 'globex', 'initech'];

// stdout is the test's: oidc-provider's notices go to stderr.
const print = (v) => process.stdout.write(`${JSON.stringify(v)}\n`);
console.log = console.info = console.error;

function key(type, options, alg) {
	const { privateKey } = generateKeyPairSync(type, options);
	return { ...privateKey.export({ format: 'jwk' }), kid: randomUUID(), alg, use: 'sig' };
}

const server = createServer();
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

let keys = [key('ec', { namedCurve: 'P-256' }, 'ES256')];
let alg = 'ES256';

function provider() {
	const p = new Provider(issuer, {
		clients: clients.map((c) => ({
			client_id: c,
			client_secret: `${c}-secret`,
			grant_types: ['client_credentials'],
			redirect_uris: [],
			response_types: [],
			id_token_signed_response_alg: 'ES256', // no ID tokens here; the default RS256 has no key
		})),
		jwks: { keys },
		ttl: { ClientCredentials: 600 },
		features: {
			clientCredentials: { enabled: true },
			devInteractions: { enabled: false },
			resourceIndicators: {
				enabled: true,
				defaultResource: () => undefined,
				useGrantedResource: () => true,
				getResourceServerInfo: (_ctx, resource) => ({
					scope: 'okso.read okso.write okso.admin',
					audience: resource,
					accessTokenFormat: 'jwt',
					accessTokenTTL: 600,
					jwt: { sign: { alg } },
				}),
			},
		},
		extraTokenClaims: (_ctx, token) => ({ org: token.clientId }),
	});
	p.on('server_error', (_ctx, err) => console.error('oidc-provider:', err));
	return p;
}

// A rotation is what an operator does: the provider restarts with a new
// key set on the same issuer URL.
let handler = provider().callback();
server.on('request', (req, res) => handler(req, res));

async function token({ client, resource, scope }) {
	const res = await fetch(`${issuer}/token`, {
		method: 'POST',
		headers: {
			'content-type': 'application/x-www-form-urlencoded',
			authorization: `Basic ${Buffer.from(`${client}:${client}-secret`).toString('base64')}`,
		},
		body: new URLSearchParams({ grant_type: 'client_credentials', resource, scope }),
	});
	const body = await res.json();
	if (!res.ok) throw new Error(`token endpoint: ${res.status} ${JSON.stringify(body)}`);
	return { token: body.access_token };
}

print({ issuer });
for await (const line of createInterface({ input: process.stdin })) {
	const cmd = JSON.parse(line);
	let out;
	try {
		switch (cmd.op) {
			case 'token':
				out = await token(cmd);
				break;
			case 'rotate': {
				const fresh = key('ed25519', undefined, 'EdDSA');
				keys = [fresh, ...keys];
				alg = 'EdDSA';
				handler = provider().callback();
				out = { kid: fresh.kid };
				break;
			}
			default:
				throw new Error(`unknown op ${cmd.op}`);
		}
	} catch (err) {
		out = { error: String(err.message ?? err) };
	}
	print(out);
}
server.close();
