# Writes OUT (gen.hpp): lplb_solve_bench.cu's helpers, CPU solve, LP generators, V2's and V3's
# kernels (launch functions cut, extern shared memory -> the emulator's buffer) and compare().
import sys
s=open(sys.argv[1]).read()
top=s[:s.index('// ---------------------------------------------------------------------------------------\n// CPU reference')]
top=top.replace('#include <cuda_runtime.h>\n','')
i=top.index('#define CK(x)'); j=top.index('} while (0)\n',i)+len('} while (0)\n')
top=top[:i]+top[j:]
top=top.replace('''  unsigned lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return static_cast<int>(lane);''','''  return emu::cur % 32;''')
cpu=s[s.index('// ---------------------------------------------------------------------------------------\n// CPU reference'):s.index('// ---------------------------------------------------------------------------------------\n// V0:')]
v0=s.index('namespace v0 {')
pro=s[s.index('template <bool kOn>\nstruct Prof',v0):]
pro=pro[:pro.index('};\n')+3]
def ns(name):
    a=s.index('namespace %s {'%name); b=s.index('}  // namespace %s\n'%name)+len('}  // namespace %s\n'%name)
    t=s[a:b]
    l=t.index('template <bool kP>\nvoid launch(')
    e=t.index('}  // namespace')
    t=t[:l]+t[e:]
    t=t.replace('extern __shared__ __align__(16) unsigned char smem[];','unsigned char* smem = emu::smem_buf;')
    return t
ag=s[s.index('// Agreement of a GPU result'):s.index('// Median microseconds')]
res='struct Result {\n  std::vector<float> x, st;\n};\n'
out='#include "emu.hpp"\n'+top+cpu+'namespace v0 {\n'+pro+'}\n'+ns('v2')+ns('v3')+res+ag
open(sys.argv[2],'w').write(out)
