// Open a preview URL in headless Chromium (Debian's, driven by playwright-core),
// click the page's button, check the DOM changed, and screenshot it.
//   node browser.mjs URL PNG   -> prints the #state text after the click
import { chromium } from 'playwright-core';

const [url, png] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox'],
});
try {
  const page = await browser.newPage();
  const resp = await page.goto(url, { timeout: 20000 });
  if (!resp || resp.status() !== 200) throw new Error(`status ${resp?.status()}`);
  const before = await page.textContent('#state');
  await page.click('#go', { timeout: 10000 });
  await page.waitForFunction(() => document.getElementById('state').textContent.startsWith('clicked'), null, { timeout: 10000 });
  const after = await page.textContent('#state');
  await page.screenshot({ path: png });
  console.log(JSON.stringify({ before, after }));
} finally {
  await browser.close();
}
