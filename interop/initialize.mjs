// Prints what initialize negotiated: {protocolVersion, capabilities, serverInfo}.
import { connect, main, print } from './lib.mjs';

main(async () => {
	const { client, transport } = await connect();
	print({
		protocolVersion: transport.protocolVersion,
		capabilities: client.getServerCapabilities(),
		serverInfo: client.getServerVersion(),
	});
	await client.close();
});
