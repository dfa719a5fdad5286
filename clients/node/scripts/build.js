#!/usr/bin/env node
'use strict';
// Run by `npm pack` / `npm publish` (prepack): copies the repository's
// proto/tumbler/v1/lock.proto into the package and generates TypeScript
// types for its messages (types/**/*.d.ts, with @grpc/proto-loader's
// generator and tsc), which index.d.ts re-exports.
const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');

const here = path.join(__dirname, '..');
const src = process.env.TUMBLER_PROTO_DIR || path.join(here, '..', '..', 'proto');
const rel = path.join('tumbler', 'v1', 'lock.proto');
if (!fs.existsSync(path.join(src, rel))) {
  throw new Error(`${path.join(src, rel)} not found: set TUMBLER_PROTO_DIR to the repository's proto/ folder`);
}
fs.rmSync(path.join(here, 'proto'), { recursive: true, force: true });
fs.mkdirSync(path.join(here, 'proto', 'tumbler', 'v1'), { recursive: true });
fs.copyFileSync(path.join(src, rel), path.join(here, 'proto', rel));

fs.rmSync(path.join(here, 'types'), { recursive: true, force: true });
const gen = require.resolve('@grpc/proto-loader/build/bin/proto-loader-gen-types.js');
execFileSync(process.execPath, [gen, rel, '--grpcLib=@grpc/grpc-js', '--outDir=types', '--longs=String',
  '--enums=String', '--defaults', '--oneofs', '--includeComments', '-I', 'proto'], { cwd: here, stdio: 'inherit' });
// The generator writes .ts; ship declarations only (types/**/*.d.ts).
const tsc = require.resolve('typescript/bin/tsc');
const sources = [];
const walk = (d) => fs.readdirSync(d, { withFileTypes: true }).forEach((e) => {
  const p = path.join(d, e.name);
  if (e.isDirectory()) walk(p); else if (p.endsWith('.ts') && !p.endsWith('.d.ts')) sources.push(p);
});
walk(path.join(here, 'types'));
execFileSync(process.execPath, [tsc, '--declaration', '--emitDeclarationOnly', '--skipLibCheck', '--target', 'es2020',
  '--module', 'commonjs', '--moduleResolution', 'node', '--outDir', 'types', ...sources], { cwd: here, stdio: 'inherit' });
sources.forEach((p) => fs.rmSync(p));
console.error('bundled proto/ and generated types/');
