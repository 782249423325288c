--[[
slurm-chaos job_submit/lua: decide in slurmctld, at submission, on jobs that ask for faults.

Written beside slurm.conf by `slurm-chaos plugin install` (JobSubmitPlugins=lua loads it).
A job asks for faults when its SPANK job environment holds SLURM_CHAOS_SPEC (what the
slurm-chaos SPANK plugin passes for --chaos), or the raw option. Then the policy file (the same
root-owned file the prolog hooks and the SPANK plugin read) decides:
  - refused: the submission fails with the reason (the job never exists, so never starts);
  - allowed: the SPEC is recorded as the job's AdminComment "slurm-chaos=<SPEC>". Only an
    administrator can set AdminComment (slurmctld refuses it from users before this script
    runs), so the prolog acts on that and on nothing the user controls.
Jobs without a SPEC pass untouched, whatever their AdminComment (an administrator may set one).
What cannot be known here (the default account) the prolog checks on the node.
A runtime error in the script would let the job through unchecked (job_submit_lua.c), so the
decision runs under pcall and an error refuses the job.
]]

local POLICY_PATH = "@POLICY_PATH@"
-- slurm.conf beside the policy (plugin install writes the policy there): its PreemptMode lines.
local SLURM_CONF = POLICY_PATH:match("^(.*)/[^/]*$") .. "/slurm.conf"
local MARK = "slurm-chaos="
local MAX_POLICY_BYTES = 16384
local MAX_ENTRIES = 64
local MAX_SPEC_LEN = 4096
local NO_VAL = 4294967294
local SHARED_NONE = 0 -- job_desc.shared after --exclusive
local SHARED_FORCE = 32768 -- partition max_share flag bit of OverSubscribe=FORCE
local SPEC_VARS = { "SLURM_CHAOS_SPEC", "SPANK_SLURM_CHAOS_SPEC", "_SLURM_SPANK_OPTION_slurm_chaos_chaos" }
local KEYS = {
	version = "int", max_nodes = "int",
	allow_users = "list", allow_accounts = "list", allow_partitions = "list", allow_reservations = "list",
	require_exclusive = "bool", allow_arrays = "bool", allow_het_jobs = "bool",
	job_interface = "iface",
}

-- The policy file: the line-oriented TOML subset of slurm_chaos/faults/policy.py.
local function parse_value(kind, text)
	if kind == "bool" then
		if text == "true" then return true end
		if text == "false" then return false end
		return nil, "expected true or false"
	elseif kind == "int" then
		if text:match("^%d+$") and #text <= 9 then return tonumber(text) end
		return nil, "expected a whole number"
	elseif kind == "iface" then
		-- policy.py IFACE_RE: 1 to 15 of A-Z a-z 0-9 _ . -, not "." or ".."
		local name = text:match('^"([%w_.-]+)"$')
		if name and #name <= 15 and name ~= "." and name ~= ".." then return name end
		return nil, "expected a quoted network interface name"
	end
	local inner = text:match("^%[(.*)%]$")
	if not inner then return nil, "expected a list of names on one line" end
	local names = {}
	if inner:match("^[ \t]*$") then return names end
	for item in (inner .. ","):gmatch("([^,]*),") do
		local trimmed = item:match("^[ \t]*(.-)[ \t]*$")
		local name = trimmed:match('^"([%w_.@*+-]+)"$')
		if not name or #name > 127 then return nil, "'" .. trimmed .. "' is not a quoted plain name" end
		names[#names + 1] = name
	end
	if #names > MAX_ENTRIES then return nil, "more than " .. MAX_ENTRIES .. " entries" end
	return names
end

local function parse_policy(text)
	local policy, number = {}, 0
	for line in (text .. "\n"):gmatch("([^\n]*)\n") do
		number = number + 1
		local where = "policy line " .. number .. ": "
		if line:find("[^\t\32-\126]") then return nil, where .. "control or non-ASCII character" end
		if not (line:match("^[ \t]*$") or line:match("^[ \t]*#")) then
			local key, value = line:match("^[ \t]*([a-z_]+)[ \t]*=[ \t]*(.-)[ \t]*$")
			if not key then return nil, where .. "expected KEY = VALUE" end
			if not KEYS[key] then return nil, where .. "unknown key '" .. key .. "'" end
			if policy[key] ~= nil then return nil, where .. key .. ": given twice" end
			local parsed, err = parse_value(KEYS[key], value)
			if parsed == nil then return nil, where .. key .. ": " .. err end
			policy[key] = parsed
		end
	end
	if policy.version ~= 1 then return nil, "policy: 'version = 1' missing or another version" end
	if policy.max_nodes == 0 then return nil, "policy: max_nodes: must be 1 or more" end
	if policy.require_exclusive == nil then policy.require_exclusive = true end
	return policy
end

-- Root-owned, a regular file, writable by nobody else: as the prolog and the plugin require.
local function load_policy()
	local stat = io.popen("/usr/bin/stat -c '%u %a %F' -- '" .. POLICY_PATH .. "' 2>/dev/null")
	local info = stat and stat:read("*l")
	if stat then stat:close() end
	local uid, mode, kind = (info or ""):match("^(%d+) (%d+) (.+)$")
	if not uid then return nil, "policy " .. POLICY_PATH .. ": cannot be read" end
	if kind ~= "regular file" and kind ~= "regular empty file" then
		return nil, "policy " .. POLICY_PATH .. ": not a regular file"
	end
	if uid ~= "0" then return nil, "policy " .. POLICY_PATH .. ": owned by uid " .. uid .. ", not root" end
	local group, other = tonumber(mode:sub(-2, -2)), tonumber(mode:sub(-1))
	if group % 4 >= 2 or other % 4 >= 2 then
		return nil, "policy " .. POLICY_PATH .. ": writable by group or others (mode " .. mode .. ")"
	end
	local fh = io.open(POLICY_PATH, "r")
	if not fh then return nil, "policy " .. POLICY_PATH .. ": cannot be read" end
	local text = fh:read(MAX_POLICY_BYTES + 1) or ""
	fh:close()
	if #text > MAX_POLICY_BYTES then return nil, "policy: larger than " .. MAX_POLICY_BYTES .. " bytes" end
	return parse_policy(text)
end

-- --------------------------------------------------------------------------- the request

local function requested_spec(job_desc)
	local env, found = job_desc.spank_job_env, {}
	if env == nil then return nil end
	for _, entry in pairs(env) do
		for i, var in ipairs(SPEC_VARS) do
			local value = entry:sub(1, #var + 1) == var .. "=" and entry:sub(#var + 2) or nil
			if value then found[i] = value end
		end
	end
	-- The plugin's canonical form first; the raw option only when nothing else came with it.
	return found[1] or found[2] or found[3]
end

-- Partitions that may suspend a running job (PreemptMode SUSPEND under a preemption plugin, or
-- GANG): a suspended job runs no epilog, and the job that preempts it gets the node with the faults
-- in place. Read from slurm.conf itself: job_submit/lua's partition records carry no PreemptMode.
-- What the file does not say here (an Include, a change since) the prolog decides from slurmctld.
local function suspends(mode, preempt_type)
	local words = {}
	for word in (mode or ""):upper():gmatch("[^,%s]+") do words[word] = true end
	if words.GANG then return true end
	return words.SUSPEND == true and (preempt_type or ""):lower() ~= "preempt/none"
end

local function preempt_modes()
	local fh = io.open(SLURM_CONF, "r")
	if not fh then return nil end
	local parts, cluster, preempt_type, default = {}, "OFF", "", nil
	for line in fh:lines() do
		local keys = {}
		for key, value in (line:gsub("#.*", "")):gmatch("(%w+)=(%S+)") do keys[key:lower()] = value end
		local name = keys.partitionname
		if name and name:upper() == "DEFAULT" then
			default = keys.preemptmode or default
		elseif name then
			parts[name] = keys.preemptmode or default or false
		else
			cluster = keys.preemptmode or cluster
			preempt_type = keys.preempttype or preempt_type
		end
	end
	fh:close()
	return parts, cluster, preempt_type
end

local function preemption_refusal(partitions)
	local modes, cluster, preempt_type = preempt_modes()
	if modes == nil then return nil end
	for _, name in ipairs(partitions) do
		local mode = modes[name] or cluster
		if suspends(mode, preempt_type) then
			return string.format("partition '%s' preempts by suspension (PreemptMode=%s): a suspended job runs "
				.. "no epilog, and the job that preempts it would get the node with the faults in place", name, mode)
		end
	end
	return nil
end

local function listed(names, value)
	if value == nil or value == "" then return false end
	for _, name in ipairs(names) do
		if name == "*" or name == value then return true end
	end
	return false
end

local function job_partitions(job_desc, part_list)
	local names = {}
	if job_desc.partition ~= nil then
		for name in job_desc.partition:gmatch("[^,]+") do names[#names + 1] = name end
	else
		for name, part in pairs(part_list) do
			if part.flag_default == 1 then names[#names + 1] = name end
		end
	end
	return names
end

local function exclusive(job_desc, part_list, partitions)
	if #partitions == 0 then return false end
	local whole = true
	for _, name in ipairs(partitions) do
		local part = part_list[name]
		if part == nil or part.max_share >= SHARED_FORCE then return false end
		if part.max_share ~= 0 then whole = false end -- 0: OverSubscribe=EXCLUSIVE
	end
	return whole or job_desc.shared == SHARED_NONE
end

-- Why the job may not inject faults, or nil: the rules of policy.py's refusal() as far as they
-- are known at submission.
local function refusal(policy, job_desc, part_list)
	local uid, user = job_desc.user_id, job_desc.user_name
	local users = policy.allow_users or {}
	if uid ~= 0 and not (listed(users, user) or listed(users, tostring(uid))) then
		local why = policy.allow_users and "not in allow_users" or "only root: allow_users is not set"
		return string.format("user '%s' (uid %d) may not inject faults (%s)", user or "?", uid, why)
	end
	local partitions = job_partitions(job_desc, part_list)
	if policy.allow_partitions then
		if #partitions == 0 then return "the job's partition is not known but allow_partitions is set" end
		for _, name in ipairs(partitions) do
			if not listed(policy.allow_partitions, name) then
				return "partition '" .. name .. "' is not in allow_partitions"
			end
		end
	end
	if policy.allow_accounts and job_desc.account ~= nil and not listed(policy.allow_accounts, job_desc.account) then
		return "account '" .. job_desc.account .. "' is not in allow_accounts"
	end
	if policy.allow_reservations and not listed(policy.allow_reservations, job_desc.reservation) then
		if job_desc.reservation == nil then
			return "the job has no reservation but allow_reservations is set (submit with --reservation)"
		end
		return "reservation '" .. job_desc.reservation .. "' is not in allow_reservations"
	end
	if policy.require_exclusive and not exclusive(job_desc, part_list, partitions) then
		return "the job does not hold its nodes exclusively (require_exclusive: submit with --exclusive)"
	end
	if not policy.allow_arrays and job_desc.array_inx ~= nil then
		return "array jobs may not inject faults (allow_arrays is not set)"
	end
	if not policy.allow_het_jobs and job_desc.het_job_offset ~= NO_VAL then
		return "heterogeneous jobs may not inject faults (allow_het_jobs is not set)"
	end
	if policy.max_nodes and job_desc.min_nodes < NO_VAL and job_desc.min_nodes > policy.max_nodes then
		return string.format("the job asks for %d nodes (max_nodes %d)", job_desc.min_nodes, policy.max_nodes)
	end
	return preemption_refusal(partitions)
end

local function decide(job_desc, part_list)
	local spec = requested_spec(job_desc)
	if spec == nil then return nil end
	if #spec == 0 or #spec > MAX_SPEC_LEN or spec:find("[^%w%p]") or spec:find("|", 1, true) then
		return "a SPEC of up to " .. MAX_SPEC_LEN .. " printable characters, without spaces or '|'", spec
	end
	local policy, err = load_policy()
	if policy == nil then return err, spec end
	local why = refusal(policy, job_desc, part_list)
	if why then return why, spec end
	job_desc.admin_comment = MARK .. spec
	slurm.log_info("slurm-chaos: job of %s (uid %d) may inject faults: AdminComment=%s%s",
		tostring(job_desc.user_name), job_desc.user_id, MARK, spec)
	return nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	local ok, why, spec = pcall(decide, job_desc, part_list)
	if ok and why == nil then return slurm.SUCCESS end
	if not ok then why, spec = "internal error: " .. tostring(why), "?" end
	local shown = (spec or "?"):gsub("[^%w%p]", "?"):sub(1, 256)
	local msg = string.format("slurm-chaos: refused --chaos=%s: %s", shown, why)
	slurm.log_info("%s (job of uid %s)", msg, tostring(job_desc.user_id))
	slurm.log_user("%s", msg)
	return slurm.ESLURM_ACCESS_DENIED
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	-- Partition, account or reservation may change while the job is pending: the prolog decides
	-- again from the job as it starts. AdminComment only an administrator can change.
	return slurm.SUCCESS
end
