// An agent in Node.js with the `openai` npm package, trained by meshrl with
//   rollout.agent_command="node examples/node-agent/agent.js"
// meshrl gives it OPENAI_BASE_URL and OPENAI_API_KEY (a key for this episode only) and the task as
// JSON on stdin; it prints its result as JSON on its last line. It plays the bundled calculator task as
// examples/agents/calculator.py does: tools=[calculator], each call run here and answered in the tool
// role, the first reply without a call is the answer, scored against the task's ground truth.
const OpenAI = require('openai');

const MAX_CALLS = 4;

// An integer expression of + - * and parentheses, by recursive descent (BigInt: no rounding).
function evaluate(text) {
  const tokens = text.match(/\d+|[-+*()]|\S/g) || [];
  let i = 0;
  const peek = () => tokens[i];
  function atom() {
    const t = tokens[i++];
    if (t === undefined) throw new Error('unexpected end');
    if (/^\d+$/.test(t)) return BigInt(t);
    if (t === '-') return -atom();
    if (t === '(') { const v = sum(); if (tokens[i++] !== ')') throw new Error('missing )'); return v; }
    throw new Error(`unexpected '${t}'`);
  }
  function product() { let v = atom(); while (peek() === '*') { i++; v *= atom(); } return v; }
  function sum() {
    let v = product();
    while (peek() === '+' || peek() === '-') { const op = tokens[i++]; const r = product(); v = op === '+' ? v + r : v - r; }
    return v;
  }
  if (text.length > 200) throw new Error('expression longer than 200 characters');
  const v = sum();
  if (i !== tokens.length) throw new Error(`unexpected '${tokens[i]}'`);
  return v.toString();
}

function calculator(args) {
  try {
    const { expression } = JSON.parse(args);
    return typeof expression === 'string' ? evaluate(expression) : 'error: the tool takes {"expression": "..."}';
  } catch (e) {
    return `error: ${e.message}`;
  }
}

async function main() {
  let input = '';
  for await (const chunk of process.stdin) input += chunk;
  const task = JSON.parse(input);
  const client = new OpenAI({ maxRetries: 0 });  // OPENAI_BASE_URL and OPENAI_API_KEY from the environment
  const messages = [...task.prompt];
  let calls = 0;
  for (let turn = 0; turn < MAX_CALLS; turn++) {
    const reply = await client.chat.completions.create({ model: 'policy', messages, tools: task.tools });
    const message = reply.choices[0].message;
    if (!message.tool_calls || message.tool_calls.length === 0) {
      const numbers = (message.content || '').match(/-?\d+/g);
      const correct = numbers !== null && String(task.ground_truth).trim() === numbers[numbers.length - 1];
      console.log(JSON.stringify({ reward: correct ? 1.0 : 0.0, acc: correct, tool_calls: calls }));
      return;
    }
    messages.push(message);
    for (const call of message.tool_calls) {
      calls += 1;
      messages.push({ role: 'tool', tool_call_id: call.id, content: calculator(call.function.arguments) });
    }
  }
  console.log(JSON.stringify({ reward: 0.0, acc: false, tool_calls: calls }));
}

main().catch((e) => { console.error(e.message); process.exit(1); });
