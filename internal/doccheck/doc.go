// Package doccheck holds the tests that keep README.md and docs/ true to
// the code: every configuration variable the code reads is in
// docs/configuration.md and nothing else is, every route of template.yaml is
// in docs/api.md, every relative link and anchor resolves, and no sentence
// runs past 40 words. It has no code of its own.
package doccheck
