// Lists every tool, page by page: prints {pages: [size...], tools: [{name, annotations, _meta}]}.
import { connect, listAll, main, print } from './lib.mjs';

main(async () => {
	const { client } = await connect();
	const { pages, tools } = await listAll(client);
	print({ pages, tools: tools.map((t) => ({ name: t.name, annotations: t.annotations, _meta: t._meta })) });
	await client.close();
});
